"""gunicorn reads ./gunicorn.conf.py by default: the settings are token_service/server/gunicorn_conf.py's.

They live in the package so an installed wheel (and the Docker image) has them
as ``-c python:token_service.server.gunicorn_conf``; this file only lets a plain
``gunicorn 'token_service:create_app()'`` started here use them too.
"""

from token_service.server.gunicorn_conf import *  # noqa: F403
