# Sourced by the scripts/check_nemo_gym_*.sh scripts: NeMo Gym 0.7.0 in its own venv ($NG_VENV), never the
# project's. nemo-gym 0.7.0 asks for Python >= 3.13.14 and pulls ray, mlflow, wandb (~150 packages, a few
# minutes), which is why it is not a test dependency. This machine has Python 3.13.0, so the wheel is
# fetched for 3.13.14 and installed with --ignore-requires-python.
# In: PY (the project's python). Out: NG_VENV. Override NG_VENV=/path/to/venv-with-nemo-gym, NG_PYTHON=python3.13.
NG_VENV=${NG_VENV:-/tmp/ngvenv}
if [ ! -x "$NG_VENV/bin/gym" ]; then
    NG_PYTHON=${NG_PYTHON:-$(PYENV_VERSION=3.13.0 pyenv which python 2>/dev/null || command -v python3.13)}
    ng_wheels=$(mktemp -d)
    "$PY" -m pip download nemo-gym==0.7.0 --no-deps --python-version 3.13.14 --only-binary=:all: -d "$ng_wheels"
    "$NG_PYTHON" -m venv "$NG_VENV"
    "$NG_VENV/bin/pip" install --ignore-requires-python "$ng_wheels"/nemo_gym-0.7.0-py3-none-any.whl
fi
