"""gunicorn settings for the Django test project (not the token service's: ./gunicorn.conf.py is theirs)."""

worker_class = "gthread"
workers = 2
threads = 8
