"""Serve the example on http://127.0.0.1:8000 (PORT to change it) with Django's own server."""

import os
import sys

from django.core.management import execute_from_command_line

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "examples.django_app.settings")
port = os.environ.get("PORT", "8000")
execute_from_command_line([sys.argv[0], "runserver", "--noreload", f"127.0.0.1:{port}", *sys.argv[1:]])
