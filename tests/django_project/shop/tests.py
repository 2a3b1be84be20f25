"""The Django app's tests, run by Django's own test runner (tests/test_django.py starts it):
a test database made by ``manage.py migrate``'s migrations (notifyq's schema comes from the
app's), ``transaction.atomic()`` deciding for the jobs written in it, and the worker command
running the shop's tasks until SIGTERM."""

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from asgiref.sync import async_to_sync
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connection, transaction
from django.db.transaction import TransactionManagementError
from django.test import Client, SimpleTestCase, TestCase, TransactionTestCase, override_settings

import notifyq
from notifyq.django import (
    enqueue,
    enqueue_many,
    enqueue_workflow,
    forget_queue,
    notifyq_settings,
    psycopg_connection,
    queue,
)
from notifyq.errors import RefusedInput
from tests.django_project.shop.models import Order

ROOT = Path(__file__).resolve().parents[3]


class Refused(Exception):
    pass


def stored(job_id):
    """The job as another connection sees it (the queue's own pool): there once committed."""
    return queue().get(job_id)


class EnqueueInTheTransactionTests(TransactionTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        # The queue's pool would keep the test runner from dropping the test database.
        cls.addClassCleanup(forget_queue)

    def test_a_committed_block_keeps_its_job(self):
        with transaction.atomic():
            order = Order.objects.create(total=42)
            job = enqueue("send_receipt", {"order": order.pk}, priority=3)
            self.assertIsNone(stored(job.job_id), "not visible before the commit")
        found = stored(job.job_id)
        self.assertEqual((found.status, found.priority), ("queued", 3))
        self.assertEqual(found.payload, {"order": order.pk})

    def test_a_rolled_back_block_drops_its_job(self):
        with self.assertRaises(Refused), transaction.atomic():
            Order.objects.create(total=42)
            job = enqueue("send_receipt", {"order": 1})
            raise Refused
        self.assertIsNone(stored(job.job_id))
        self.assertEqual(Order.objects.count(), 0)

    def test_a_rolled_back_savepoint_drops_only_its_own_job(self):
        with transaction.atomic():
            kept = enqueue("echo", {"n": 1})
            with self.assertRaises(Refused), transaction.atomic():
                dropped = enqueue("echo", {"n": 2})
                raise Refused
        self.assertIsNotNone(stored(kept.job_id))
        self.assertIsNone(stored(dropped.job_id))

    def test_outside_a_block_the_job_commits_at_once(self):
        job = enqueue("echo", {"n": 1})
        self.assertIsNotNone(stored(job.job_id))

    def test_many_jobs_and_workflows_follow_the_block(self):
        flow = notifyq.chain(notifyq.step("echo"), notifyq.step("echo", ref="last"))
        with self.assertRaises(Refused), transaction.atomic():
            # 300 jobs: more than one statement, in one pipeline, on Django's cursor class.
            many = enqueue_many([{"task": "echo", "payload": {"n": n}} for n in range(300)])
            created = enqueue_workflow(flow)
            raise Refused
        self.assertIsNone(stored(many[-1].job_id))
        self.assertIsNone(stored(created.jobs["last"]))
        with transaction.atomic():
            many = enqueue_many([{"task": "echo", "payload": {"n": n}} for n in range(300)])
            created = enqueue_workflow(flow)
        self.assertEqual(len(many), 300)
        self.assertIsNotNone(stored(many[-1].job_id))
        self.assertEqual(stored(created.jobs["last"]).status, "waiting")

    def test_a_failed_enqueue_leaves_the_block_to_be_rolled_back(self):
        # The database refused the statement, so the transaction is aborted: Django must know,
        # as it knows after a failed query of its own.
        with transaction.atomic():
            with self.assertRaises(RefusedInput):
                enqueue("echo", {}, depends_on=[uuid.uuid4()])
            with self.assertRaises(TransactionManagementError):
                Order.objects.count()
        self.assertEqual(Order.objects.count(), 0)

    def test_a_view_commits_the_order_and_its_job_together(self):
        answer = self.client.post("/checkout", {"total": 42}, content_type="application/json")
        self.assertEqual(answer.status_code, 201)
        created = answer.json()
        job = stored(created["job_id"])
        self.assertEqual((job.task, job.payload), ("send_receipt", {"order": created["order"]}))

    def test_a_view_that_fails_leaves_neither(self):
        self.client.raise_request_exception = False
        before = self.receipts()
        answer = self.client.post(
            "/checkout", {"total": 42, "refused": True}, content_type="application/json"
        )
        self.assertEqual(answer.status_code, 500)
        self.assertEqual(Order.objects.count(), 0)
        self.assertEqual(self.receipts(), before)

    def test_the_json_view_answers_a_client_without_a_csrf_token(self):
        # As curl calls it: no cookie, no token; the test client skips the check unless told.
        client = Client(enforce_csrf_checks=True)
        answer = client.post("/checkout", {"total": 42}, content_type="application/json")
        self.assertEqual(answer.status_code, 201, answer.content)

    def test_the_json_view_refuses_a_form_which_another_sites_page_could_send(self):
        before = self.receipts()
        client = Client(enforce_csrf_checks=True)
        self.assertEqual(client.post("/checkout", {"total": 42}).status_code, 415)
        bad = client.post("/checkout", "{", content_type="application/json")
        self.assertEqual(bad.status_code, 400)
        self.assertEqual(Order.objects.count(), 0)
        self.assertEqual(self.receipts(), before)

    def receipts(self):
        # The jobs of earlier tests stay: Django empties only its models' tables.
        with psycopg_connection().cursor() as cursor:
            cursor.execute("SELECT count(*) FROM notifyq.jobs WHERE task = 'send_receipt'")
            return cursor.fetchone()[0]


class InATestCaseTests(TestCase):
    def test_the_test_database_has_the_schema_and_the_test_its_transaction(self):
        job = enqueue("echo", {"n": 1})
        with psycopg_connection().cursor() as cursor:
            cursor.execute("SELECT status FROM notifyq.jobs WHERE id = %s", [job.job_id])
            self.assertEqual(cursor.fetchone(), ("queued",))


class SettingsTests(SimpleTestCase):
    def test_the_database_is_djangos_not_the_environments(self):
        url = notifyq_settings().database_url
        self.assertIn(f"dbname={connection.settings_dict['NAME']}", url)
        self.assertNotEqual(url, os.environ["DATABASE_URL"])

    @override_settings(
        NOTIFYQ={
            "concurrency": 3,
            "QUEUES": ["mail", "reports"],
            "IMPORT": "shop.more_tasks",
            "DATABASE_URL": "postgresql://app@db/shop",
        }
    )
    def test_keys_are_notifyq_variables_without_their_prefix(self):
        settings = notifyq_settings(concurrency=7)
        self.assertEqual(settings.concurrency, 7, "a command's flag wins")
        self.assertEqual(settings.queues, ["mail", "reports"])
        self.assertEqual(settings.imports, ["shop.more_tasks"])
        self.assertEqual(settings.database_url, "postgresql://app@db/shop")

    @override_settings(NOTIFYQ={"CONCURENCY": 3})
    def test_an_unknown_key_fails_the_system_check(self):
        with self.assertRaisesMessage(SystemCheckError, "NOTIFYQ['CONCURENCY']"):
            call_command("check")

    @override_settings(NOTIFYQ={"CONCURRENCY": 0})
    def test_a_bad_value_is_named(self):
        with self.assertRaisesMessage(ImproperlyConfigured, "NOTIFYQ_CONCURRENCY"):
            notifyq_settings()

    @override_settings(NOTIFYQ={"DATABASE": "other"})
    def test_an_unknown_alias_is_named(self):
        with self.assertRaisesMessage(ImproperlyConfigured, "'other'"):
            notifyq_settings()


class MigrateCommandTests(TransactionTestCase):
    def test_it_finds_the_schema_the_migration_made(self):
        with tempfile.TemporaryFile("w+") as out:
            call_command("notifyq_migrate", stdout=out)
            out.seek(0)
            self.assertIn("nothing to apply", out.read())


class WorkerCommandTests(TransactionTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.addClassCleanup(forget_queue)

    def start_worker(self, log):
        env = {
            **os.environ,
            # The test database, which the worker's Django reaches as its own.
            "SHOP_DATABASE": connection.settings_dict["NAME"],
            "SHOP_APPLICATION_NAME": "shop-worker",
            "PYTHONUNBUFFERED": "1",
        }
        worker = subprocess.Popen(
            [sys.executable, "tests/django_project/manage.py", "notifyq_worker"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.addCleanup(lambda: worker.poll() is None and worker.kill())
        return worker

    def worker_connections(self):
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE application_name = 'shop-worker' AND datname = current_database()"
            )
            return cursor.fetchone()[0]

    def test_it_runs_the_shops_tasks_and_stops_on_sigterm(self):
        order = Order.objects.create(total=42)
        receipt = enqueue("send_receipt", {"order": order.pk})
        count = enqueue("count_orders")
        with tempfile.NamedTemporaryFile("w+") as log:
            worker = self.start_worker(log)
            try:
                done = queue().wait(receipt.job_id, timeout=20)
                self.assertEqual((done.status, done.result), ("completed", {"sent": 1}))
                done = queue().wait(count.job_id, timeout=20)
                self.assertEqual((done.status, done.result), ("completed", 1))
                order.refresh_from_db()
                self.assertTrue(order.receipt_sent)
                # CONN_MAX_AGE is 0: the ORM's connections of both handlers (a thread's, and
                # that of the async methods) are closed after their job, as after a request.
                deadline = time.monotonic() + 10
                while self.worker_connections() and time.monotonic() < deadline:
                    time.sleep(0.02)
                self.assertEqual(self.worker_connections(), 0)
                worker.send_signal(signal.SIGTERM)
                self.assertEqual(worker.wait(timeout=20), 0)
            finally:
                log.seek(0)
                output = log.read()
            self.assertIn("received SIGTERM: draining", output)
            self.assertIn("stopped", output)

    def test_a_test_can_run_the_jobs_it_committed_with_a_burst(self):
        order = Order.objects.create(total=42)
        receipt = enqueue("send_receipt", {"order": order.pk})
        call_command("notifyq_worker", "--burst")
        self.assertEqual(stored(receipt.job_id).status, "completed")
        order.refresh_from_db()
        self.assertTrue(order.receipt_sent)
        # The process goes on after the command, async ORM calls included.
        self.assertEqual(async_to_sync(count_orders)(), 1)


async def count_orders():
    return await Order.objects.acount()
