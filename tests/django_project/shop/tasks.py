from notifyq import task

from .models import Order


@task(max_attempts=5)
def send_receipt(payload: dict) -> dict:
    sent = Order.objects.filter(pk=payload["order"]).update(receipt_sent=True)
    return {"sent": sent}  # ... and mail it


@task
async def count_orders(payload: dict) -> int:  # async handlers use the ORM's async methods
    return await Order.objects.acount()
