# Sourced by the scripts/check_nemo_gym_*.sh scripts: NeMo Gym 0.7.0 in its own venv ($NG_VENV), never the
# project's. nemo-gym 0.7.0 asks for Python >= 3.13.14 and pulls ray, mlflow, wandb (~150 packages, a few
# minutes), which is why it is not a test dependency. The wheel is fetched for 3.13.14; with a Python 3.13
# it is installed with --ignore-requires-python, without one its dependency list
# (nemo_gym_0.7.0_requirements.txt, read off the wheel) goes first and the wheel after it, --no-deps.
# In: PY (the project's python). Out: NG_VENV. Override NG_VENV=/path/to/venv-with-nemo-gym, NG_PYTHON=python3.13.
NG_VENV=${NG_VENV:-/tmp/ngvenv}
if [ ! -x "$NG_VENV/bin/gym" ]; then
    NG_PYTHON=${NG_PYTHON:-$(PYENV_VERSION=3.13.0 pyenv which python 2>/dev/null || command -v python3.13 || true)}
    ng_wheels=$(mktemp -d)
    "$PY" -m pip download nemo-gym==0.7.0 --no-deps --python-version 3.13.14 --only-binary=:all: -d "$ng_wheels"
    if [ -n "$NG_PYTHON" ]; then
        "$NG_PYTHON" -m venv "$NG_VENV"
        "$NG_VENV/bin/pip" install --ignore-requires-python "$ng_wheels"/nemo_gym-0.7.0-py3-none-any.whl
    else
        # No Python 3.13 here: the wheel's code runs on 3.11 too. Its dependencies first (so none is resolved
        # past its own Requires-Python), then the wheel itself without them; math-verify 0.8.0 is what
        # NeMo Gym's math_with_judge server pins.
        python3 -m venv "$NG_VENV"
        "$NG_VENV/bin/pip" install -r "$(dirname "${BASH_SOURCE[0]}")/nemo_gym_0.7.0_requirements.txt"
        "$NG_VENV/bin/pip" install --no-deps --ignore-requires-python "$ng_wheels"/nemo_gym-0.7.0-py3-none-any.whl
        "$NG_VENV/bin/pip" install "math-verify==0.8.0"
    fi
fi
