import json

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from notifyq.django import enqueue

from .models import Order


# A JSON API for scripts and other services, so exempt from Django's CSRF check (which answers
# 403 to any POST without its cookie and token, curl's included). That is safe here: CSRF is a
# browser sending a user's cookies with a request another site's page made, and such a page can
# send application/json only after a CORS preflight, which this project never grants; nor does
# this view act on anyone's login. A view that takes forms, or works on a logged-in user's
# behalf through a cookie, keeps the check.
@csrf_exempt
@require_POST
def checkout(request: HttpRequest) -> JsonResponse:
    if request.content_type != "application/json":
        return JsonResponse({"detail": "send application/json"}, status=415)
    try:
        body = json.loads(request.body)
        total = int(body["total"])
    except (ValueError, KeyError, TypeError):
        return JsonResponse({"detail": 'a JSON object with an integer "total"'}, status=400)
    with transaction.atomic():
        order = Order.objects.create(total=total)
        job = enqueue("send_receipt", {"order": order.pk})  # in the block's transaction
        if body.get("refused"):
            raise RuntimeError("payment refused")  # rolls back the order and its job
    return JsonResponse({"order": order.pk, "job_id": str(job.job_id)}, status=201)
