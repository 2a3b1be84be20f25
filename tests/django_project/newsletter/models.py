from django.db import models


class Subscriber(models.Model):
    email = models.EmailField(unique=True)
    welcomed = models.BooleanField(default=False)
