import json

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.tasks import TaskResultStatus
from django.tasks.exceptions import TaskResultDoesNotExist
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from .models import Subscriber
from .tasks import welcome


@csrf_exempt  # a JSON API for scripts: see shop/views.py for why that is safe
@require_POST
def subscribe(request: HttpRequest) -> JsonResponse:
    try:
        email = str(json.loads(request.body)["email"])
    except (ValueError, KeyError, TypeError):
        return JsonResponse({"detail": 'a JSON object with an "email"'}, status=400)
    with transaction.atomic():
        subscriber = Subscriber.objects.create(email=email)
        result = welcome.enqueue(subscriber.pk)  # a notifyq job, in the block's transaction
    return JsonResponse({"subscriber": subscriber.pk, "task_result": result.id}, status=201)


def welcomed(request: HttpRequest, result_id: str) -> JsonResponse:
    try:
        result = welcome.get_result(result_id)
    except TaskResultDoesNotExist:
        return JsonResponse({"detail": "no such task result"}, status=404)
    answer = {"status": result.status, "attempts": result.attempts}
    if result.status == TaskResultStatus.SUCCESSFUL:
        answer["return_value"] = result.return_value
    elif result.errors:
        answer["error"] = result.errors[-1].exception_class_path
    return JsonResponse(answer)
