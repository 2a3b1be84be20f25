from django.db import transaction
from django.http import HttpRequest, JsonResponse

from notifyq.django import enqueue

from .models import Order


def checkout(request: HttpRequest) -> JsonResponse:
    with transaction.atomic():
        order = Order.objects.create(total=int(request.POST["total"]))
        job = enqueue("send_receipt", {"order": order.pk})  # in the block's transaction
        if request.POST.get("refused"):
            raise RuntimeError("payment refused")  # rolls back the order and its job
    return JsonResponse({"order": order.pk, "job_id": str(job.job_id)}, status=201)
