import django
from django.urls import path

from tests.django_project.shop import views

urlpatterns = [path("checkout", views.checkout)]

if django.VERSION >= (6,):
    from tests.django_project.newsletter import views as newsletter

    urlpatterns += [
        path("subscribe", newsletter.subscribe),
        path("welcomed/<str:result_id>", newsletter.welcomed),
    ]
