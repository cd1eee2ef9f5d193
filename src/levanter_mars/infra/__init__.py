"""Launching training on TPU pods through Ray (and on a local Ray cluster), or with plain ``gcloud``.

See ``infra/README.md``.
"""
