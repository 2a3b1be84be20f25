from django.urls import path

from tests.django_project.shop import views

urlpatterns = [path("checkout", views.checkout)]
