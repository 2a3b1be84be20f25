"""The shop's tasks, found by ``manage.py notifyq_worker`` as the tasks module of an app."""

from notifyq import task
from tests.django_project.shop.models import Order


@task
def send_receipt(payload: dict) -> dict:
    sent = Order.objects.filter(pk=payload["order"]).update(receipt_sent=True)
    return {"sent": sent}


@task
async def count_orders(payload: dict) -> int:
    return await Order.objects.acount()
