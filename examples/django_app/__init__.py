"""A Django project: a payment view behind an anti-duplicate token, a DRF API behind Idempotency-Key.

``make example-django`` (or ``.venv/bin/python -m examples.django_app``) serves it on
http://127.0.0.1:8300; ``PORT`` changes the port.
"""
