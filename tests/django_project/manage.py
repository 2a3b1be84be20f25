"""The test project's manage.py: ``python tests/django_project/manage.py test ...`` from the
repository's root, with the root on PYTHONPATH."""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.django_project.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
