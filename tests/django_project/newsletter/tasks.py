from django.tasks import TaskContext, task

from .models import Subscriber


class Unsubscribed(Exception):
    pass


@task(priority=10, queue_name="mail")
def welcome(subscriber_id: int) -> dict:
    subscriber = Subscriber.objects.get(pk=subscriber_id)
    if subscriber.email.endswith("@invalid"):
        raise Unsubscribed(subscriber.email)
    Subscriber.objects.filter(pk=subscriber_id).update(welcomed=True)
    return {"welcomed": subscriber.email}  # ... and mail them


@task
async def count_subscribers(welcomed: bool = True) -> int:  # the ORM's async methods
    return await Subscriber.objects.filter(welcomed=welcomed).acount()


@task(takes_context=True)
def report(context: TaskContext, title: str) -> str:
    return f"{title}: attempt {context.attempt} of task result {context.task_result.id}"
