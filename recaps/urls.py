from django.urls import path

from recaps.views.apis import RecapCheckoutApi, RecapDetailApi, RecapPurchaseApi, RecapRedeemApi

app_name = "recaps"
urlpatterns = [
    path("", RecapPurchaseApi.as_view(), name="purchase"),
    path("<uuid:recap_id>/", RecapDetailApi.as_view(), name="detail"),
    path("<uuid:recap_id>/checkout/", RecapCheckoutApi.as_view(), name="checkout"),
    path("<uuid:recap_id>/redeem/", RecapRedeemApi.as_view(), name="redeem"),
]
