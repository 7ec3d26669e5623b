"""KVCompass services: one sub-package per service, each runnable with ``python -m``."""
