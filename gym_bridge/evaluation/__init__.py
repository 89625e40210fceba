"""Offline evaluation of a model on stored data (``gym-bridge eval``): no servers, no generation."""
