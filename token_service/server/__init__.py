"""The HTTP service (the ``[server]`` extra): Flask app, hot path, CLI, gunicorn settings, telemetry."""
