"""Django's own tasks (django.tasks, Django 6) on notifyq's backend, run by Django's test runner
(tests/test_django_tasks.py starts it): ``.enqueue()`` writing a job in the transaction of
Django's connection, Django's priorities, queues and ``run_after`` on the job, a worker (a
burst in this process, and ``manage.py notifyq_worker`` in another) running the tasks by their
module path, and ``get_result`` answering Django's statuses, return values and errors."""

import json
import os
import signal
import subprocess
import sys
import tempfile
import uuid
from datetime import timedelta
from pathlib import Path

from django.core import checks
from django.core.management import call_command
from django.db import connection, transaction
from django.tasks import TaskResultStatus, default_task_backend, task_backends
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist, TaskResultMismatch
from django.tasks.signals import task_enqueued
from django.test import Client, SimpleTestCase, TransactionTestCase, override_settings
from django.utils import timezone

import notifyq
import notifyq.django
from notifyq.django import TaskBackend, forget_queue, psycopg_connection, queue
from tests.django_project.newsletter.models import Subscriber
from tests.django_project.newsletter.tasks import count_subscribers, report, welcome

ROOT = Path(__file__).resolve().parents[3]
WELCOME = "tests.django_project.newsletter.tasks.welcome"


class Refused(Exception):
    pass


def job_row(result_id):
    """The job's row as Django's connection sees it: in the current transaction too."""
    with psycopg_connection().cursor() as cursor:
        cursor.execute(
            "SELECT task, queue, priority, payload, run_at, status, max_attempts "
            "FROM notifyq.jobs WHERE id = %s",
            [result_id],
        )
        row = cursor.fetchone()
    # Django's cursor hands jsonb over as its text.
    return None if row is None else (*row[:3], json.loads(row[3]), *row[4:])


class TasksTestCase(TransactionTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        # get_result reads through the process's queue, whose pool would keep the test runner
        # from dropping the test database.
        cls.addClassCleanup(forget_queue)


class EnqueueTests(TasksTestCase):
    def test_the_backend_is_notifyqs(self):
        backend = task_backends["default"]
        self.assertIsInstance(backend, TaskBackend)
        self.assertTrue(backend.supports_defer)
        self.assertTrue(backend.supports_priority)
        self.assertTrue(backend.supports_get_result)
        self.assertTrue(backend.supports_async_task)

    def test_a_task_is_a_job_of_its_module_path_with_its_queue_priority_and_arguments(self):
        subscriber = Subscriber.objects.create(email="ada@example.org")
        result = welcome.enqueue(subscriber.pk)
        self.assertEqual(result.status, TaskResultStatus.READY)
        self.assertEqual(result.args, [subscriber.pk])
        self.assertIsNotNone(result.enqueued_at)
        task, queue_name, priority, payload, _, status, _ = job_row(result.id)
        self.assertEqual((task, queue_name, priority), (WELCOME, "mail", 10))
        self.assertEqual(payload, {"args": [subscriber.pk], "kwargs": {}})
        self.assertEqual(status, "queued")

    def test_using_changes_priority_queue_and_run_after(self):
        later = timezone.now() + timedelta(hours=1)
        result = welcome.using(priority=-100, queue_name="default", run_after=later).enqueue(1)
        _, queue_name, priority, _, run_at, _, _ = job_row(result.id)
        self.assertEqual((queue_name, priority, run_at), ("default", -100, later))
        high = count_subscribers.using(priority=100).enqueue(welcomed=False)
        self.assertEqual(job_row(high.id)[2], 100)
        self.assertEqual(job_row(high.id)[3], {"args": [], "kwargs": {"welcomed": False}})

    def test_djangos_own_checks_refuse_what_the_backend_cannot_do(self):
        with self.assertRaisesMessage(InvalidTask, "priority"):
            welcome.using(priority=101)
        with self.assertRaisesMessage(InvalidTask, "Queue 'reports' is not valid"):
            welcome.using(queue_name="reports")
        with self.assertRaisesMessage(InvalidTask, "aware"), self.settings(USE_TZ=True):
            welcome.using(run_after=timezone.now().replace(tzinfo=None))
        with self.assertRaises(TypeError):
            welcome.enqueue(object())

    def test_a_committed_block_keeps_its_task_and_a_rolled_back_one_drops_it(self):
        with transaction.atomic():
            kept = welcome.enqueue(1)
            self.assertIsNotNone(job_row(kept.id), "written on Django's connection")
            with self.assertRaises(TaskResultDoesNotExist):
                welcome.get_result(kept.id)  # not committed: another connection sees nothing
        self.assertEqual(welcome.get_result(kept.id).status, TaskResultStatus.READY)
        with self.assertRaises(Refused), transaction.atomic():
            dropped = welcome.enqueue(2)
            raise Refused
        self.assertIsNone(job_row(dropped.id))

    def test_enqueue_sends_djangos_signal(self):
        sent = []

        def enqueued(sender, task_result, **kwargs):
            sent.append(task_result.id)

        task_enqueued.connect(enqueued)
        self.addCleanup(task_enqueued.disconnect, enqueued)
        result = welcome.enqueue(1)
        self.assertEqual(sent, [result.id])

    def test_a_view_commits_the_subscriber_with_its_task(self):
        answer = Client(enforce_csrf_checks=True).post(
            "/subscribe", {"email": "grace@example.org"}, content_type="application/json"
        )
        self.assertEqual(answer.status_code, 201, answer.content)
        created = answer.json()
        result = welcome.get_result(created["task_result"])
        self.assertEqual(result.args, [created["subscriber"]])
        read = Client().get(f"/welcomed/{created['task_result']}")
        self.assertEqual(read.json(), {"status": "READY", "attempts": 0})
        call_command("notifyq_worker", "--burst", "--queues", "mail")
        read = Client().get(f"/welcomed/{created['task_result']}")
        self.assertEqual(
            read.json(),
            {
                "status": "SUCCESSFUL",
                "attempts": 1,
                "return_value": {"welcomed": "grace@example.org"},
            },
        )
        self.assertEqual(Client().get(f"/welcomed/{uuid.uuid4()}").status_code, 404)

    def test_queues_default_to_djangos_default_queue_only(self):
        backend = TaskBackend("other", {"BACKEND": "notifyq.django.TaskBackend"})
        self.assertEqual(backend.queues, {"default"})
        with self.assertRaisesMessage(InvalidTask, "Queue 'mail' is not valid"):
            backend.validate_task(welcome)

    @override_settings(
        TASKS={"default": {"BACKEND": "notifyq.django.TaskBackend", "OPTIONS": {"MAX_ATTEMPTS": 0}}}
    )
    def test_a_bad_option_is_named(self):
        with self.assertRaisesMessage(InvalidTask, "MAX_ATTEMPTS"):
            task_backends["default"]


class ResultTests(TasksTestCase):
    def test_a_worker_runs_the_task_and_the_result_has_its_return_value(self):
        subscriber = Subscriber.objects.create(email="ada@example.org")
        result = welcome.enqueue(subscriber.pk)
        call_command("notifyq_worker", "--burst", "--queues", "mail")
        result.refresh()
        self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)
        self.assertEqual(result.return_value, {"welcomed": "ada@example.org"})
        self.assertEqual(result.attempts, 1)
        self.assertIsNotNone(result.started_at)
        self.assertIsNotNone(result.finished_at)
        self.assertEqual(result.errors, [])
        subscriber.refresh_from_db()
        self.assertTrue(subscriber.welcomed)

    def test_async_tasks_and_tasks_that_take_the_context_run(self):
        Subscriber.objects.create(email="ada@example.org", welcomed=True)
        counted = count_subscribers.enqueue()
        reported = report.enqueue("weekly")
        call_command("notifyq_worker", "--burst")
        self.assertEqual(count_subscribers.get_result(counted.id).return_value, 1)
        self.assertEqual(
            report.get_result(reported.id).return_value,
            f"weekly: attempt 1 of task result {reported.id}",
        )

    @override_settings(
        TASKS={
            "default": {
                "BACKEND": "notifyq.django.TaskBackend",
                "QUEUES": ["default", "mail"],
                "OPTIONS": {"MAX_ATTEMPTS": 1},
            }
        }
    )
    def test_a_task_that_raises_is_failed_with_its_exceptions_path(self):
        subscriber = Subscriber.objects.create(email="gone@invalid")
        result = welcome.enqueue(subscriber.pk)
        self.assertEqual(job_row(result.id)[6], 1)
        call_command("notifyq_worker", "--burst", "--queues", "mail")
        result = welcome.get_result(result.id)
        self.assertEqual(result.status, TaskResultStatus.FAILED)
        (error,) = result.errors
        self.assertEqual(
            error.exception_class_path, "tests.django_project.newsletter.tasks.Unsubscribed"
        )
        self.assertIn("gone@invalid", error.traceback)
        self.assertIn("tasks.py", error.traceback, "where it was raised")
        from tests.django_project.newsletter.tasks import Unsubscribed

        self.assertIs(error.exception_class, Unsubscribed)
        with self.assertRaisesMessage(ValueError, "Task failed"):
            result.return_value  # noqa: B018
        self.assertEqual(
            queue().get(result.id).last_error.split("\n")[0],
            "tests.django_project.newsletter.tasks.Unsubscribed: gone@invalid",
        )

    def test_a_failed_attempt_with_attempts_left_is_ready_again(self):
        subscriber = Subscriber.objects.create(email="gone@invalid")
        result = welcome.enqueue(subscriber.pk)
        call_command("notifyq_worker", "--burst", "--queues", "mail")
        result.refresh()
        self.assertEqual(result.status, TaskResultStatus.READY)
        self.assertEqual(result.attempts, 1)
        self.assertEqual(
            [e.exception_class_path for e in result.errors],
            ["tests.django_project.newsletter.tasks.Unsubscribed"],
        )

    def test_a_builtin_exception_keeps_its_builtin_path(self):
        result = welcome.enqueue(-1)  # no such subscriber: Subscriber.DoesNotExist
        missing = report.enqueue()  # no title: TypeError
        call_command("notifyq_worker", "--burst")
        self.assertEqual(
            welcome.get_result(result.id).errors[0].exception_class_path,
            "tests.django_project.newsletter.models.Subscriber.DoesNotExist",
        )
        errors = report.get_result(missing.id).errors
        self.assertEqual(errors[0].exception_class_path, "builtins.TypeError")
        self.assertIs(errors[0].exception_class, TypeError)

    def test_a_cancelled_task_is_failed(self):
        result = welcome.enqueue(1)
        with psycopg_connection().cursor() as cursor:  # as POST /jobs/{id}/cancel does
            cursor.execute("SELECT * FROM notifyq.cancel_job_v2(%s)", [result.id])
        result.refresh()
        self.assertEqual(result.status, TaskResultStatus.FAILED)
        self.assertEqual(result.errors[-1].exception_class_path, "notifyq.django.JobCancelled")
        self.assertIs(result.errors[-1].exception_class, notifyq.django.JobCancelled)

    def test_an_unknown_or_malformed_id_or_another_tasks_result_does_not_exist(self):
        with self.assertRaises(TaskResultDoesNotExist):
            default_task_backend.get_result(str(uuid.uuid4()))
        with self.assertRaises(TaskResultDoesNotExist):
            default_task_backend.get_result("not-an-id")
        job = notifyq.django.enqueue("echo", {"n": 1})  # a job, but no Django task's
        with self.assertRaises(TaskResultDoesNotExist):
            default_task_backend.get_result(str(job.job_id))
        result = welcome.enqueue(1)
        with self.assertRaises(TaskResultMismatch):
            report.get_result(result.id)


class WorkerCommandTests(TasksTestCase):
    def test_the_worker_command_runs_djangos_tasks_until_sigterm(self):
        subscriber = Subscriber.objects.create(email="ada@example.org")
        result = welcome.enqueue(subscriber.pk)
        env = {
            **os.environ,
            "SHOP_DATABASE": connection.settings_dict["NAME"],
            "PYTHONUNBUFFERED": "1",
        }
        with tempfile.NamedTemporaryFile("w+") as log:
            worker = subprocess.Popen(
                [sys.executable, "tests/django_project/manage.py", "notifyq_worker"],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            self.addCleanup(lambda: worker.poll() is None and worker.kill())
            done = queue().wait(result.id, timeout=30)
            worker.send_signal(signal.SIGTERM)
            self.assertEqual(worker.wait(timeout=20), 0)
            log.seek(0)
            output = log.read()
        self.assertEqual(done.status, "completed", output)
        self.assertEqual(welcome.get_result(result.id).return_value["welcomed"], subscriber.email)


class CheckTests(SimpleTestCase):
    @override_settings(INSTALLED_APPS=["tests.django_project.newsletter"])
    def test_the_backend_needs_the_app_that_makes_the_schema(self):
        errors = [e for e in checks.run_checks() if e.id == "notifyq.E002"]
        self.assertEqual(len(errors), 1, errors)
