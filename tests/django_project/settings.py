"""A Django project as the README sets one up, for tests/test_django.py.

The server is DATABASE_URL's; the database's name comes from SHOP_DATABASE (the test runner
makes its own, named by SHOP_TEST_DATABASE, and drops it), so that nothing here ever writes to
the server's own databases. SHOP_APPLICATION_NAME tells its connections apart in
pg_stat_activity.

On Django 6 or later, Django's own tasks run on notifyq too (TASKS), and the newsletter app,
whose tasks are Django's, is installed.
"""

import os

import django
from psycopg.conninfo import conninfo_to_dict

_server = conninfo_to_dict(os.environ["DATABASE_URL"])

SECRET_KEY = "only-for-tests"
DEBUG = False
ALLOWED_HOSTS = ["testserver", "127.0.0.1", "localhost"]
# The middleware `django-admin startproject` writes, CSRF's included (the README's curl must
# pass it), less the session, auth and messages ones, whose apps this project does not install.
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
USE_TZ = True
ROOT_URLCONF = "tests.django_project.urls"
INSTALLED_APPS = ["notifyq.django", "tests.django_project.shop"]
if django.VERSION >= (6,):
    INSTALLED_APPS.append("tests.django_project.newsletter")
    TASKS = {
        "default": {
            "BACKEND": "notifyq.django.TaskBackend",
            "QUEUES": ["default", "mail"],
        }
    }
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ["SHOP_DATABASE"],
        "USER": _server.get("user", ""),
        "PASSWORD": _server.get("password", ""),
        "HOST": _server.get("host", ""),
        "PORT": _server.get("port", ""),
        "OPTIONS": {"application_name": os.environ.get("SHOP_APPLICATION_NAME", "shop")},
        "TEST": {"NAME": os.environ.get("SHOP_TEST_DATABASE")},
    }
}
NOTIFYQ = {"CONCURRENCY": 4, "POLL_INTERVAL": 30, "SHUTDOWN_GRACE": 5}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
