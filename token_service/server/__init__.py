"""The HTTP service (the ``[server]`` extra): Flask app, hot path, CLI, gunicorn settings, telemetry."""

__all__: list[str] = []
