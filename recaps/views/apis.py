"""The recap API for signed-in buyers (DRF): validate input, call a service, answer a domain
error as a problem (kernel/problems.py), never a 500. Endpoints and errors: docs/flows.md,
"Flow 3"; who may call it: docs/security.md, "The buyer API".
"""

from django.contrib.auth.models import User
from rest_framework import serializers, status
from rest_framework.exceptions import NotAuthenticated
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from kernel.api_access import BoundedJSONParser, SameSiteWrites, require_json
from kernel.errors import EventDropError
from kernel.problems import problem
from recaps.errors import (
    RECAP_NOT_YOURS,
    CheckoutError,
    CheckoutNotConfigured,
    EventUnknown,
    RecapNotFound,
    RecapPermissionDenied,
    RecapStateConflict,
)
from recaps.models import Event, RecapVideo
from recaps.selectors import recap_get
from recaps.services import recap_checkout_create, recap_create, recap_redeem_free

# Most specific first: the first matching class decides the answer.
_ERROR_RESPONSES: list[tuple[type[EventDropError], int, str]] = [
    (RecapNotFound, status.HTTP_404_NOT_FOUND, "recap_not_found"),
    (EventUnknown, status.HTTP_404_NOT_FOUND, "event_not_found"),
    (RecapPermissionDenied, status.HTTP_403_FORBIDDEN, "forbidden"),
    (RecapStateConflict, status.HTTP_409_CONFLICT, "conflict"),
    (CheckoutNotConfigured, status.HTTP_503_SERVICE_UNAVAILABLE, "checkout_not_configured"),
    (CheckoutError, status.HTTP_503_SERVICE_UNAVAILABLE, "checkout_unavailable"),
]


def _error(exc: EventDropError, **extra) -> Response:
    for error_class, http_status, code in _ERROR_RESPONSES:
        if isinstance(exc, error_class):
            return problem(http_status, str(exc), code=code, **extra)
    raise exc


def _recap_data(recap: RecapVideo) -> dict:
    return {
        "id": str(recap.id),
        "event_id": recap.event_id,
        "status": recap.status,
        "is_free": recap.is_free,
        "video_url": recap.video_url or None,
        "failure_reason": recap.failure_reason or None,
        # While unpaid: the last payment failed, or the checkout expired (a new one pays).
        "awaiting_payment_reason": recap.awaiting_payment_reason or None,
        "created_at": recap.created_at.isoformat(),
    }


def _buyer(request: Request) -> User:
    """The signed-in buyer (IsAuthenticated has let only those through)."""
    if not isinstance(request.user, User):
        raise NotAuthenticated()
    return request.user


def _own_recap(request: Request, recap_id: str) -> RecapVideo:
    recap = recap_get(recap_id=recap_id)
    if recap.buyer_id != _buyer(request).pk:
        raise RecapPermissionDenied(RECAP_NOT_YOURS)
    return recap


class _BuyerAPIView(APIView):
    # Authenticated by the project's defaults (REST_FRAMEWORK): a token, or the session with
    # its CSRF check; the token scheme first, so an anonymous call is a 401 that asks for a
    # token, never a Basic challenge a browser would prompt for and then cache.
    permission_classes = [IsAuthenticated, SameSiteWrites]
    parser_classes = [BoundedJSONParser]

    def initial(self, request: Request, *args, **kwargs) -> None:
        super().initial(request, *args, **kwargs)  # authentication and permissions first
        require_json(request)


class NoInputSerializer(serializers.Serializer):
    """The body of a write that takes no fields: a JSON object, `{}`."""


class RecapPurchaseApi(_BuyerAPIView):
    class InputSerializer(serializers.Serializer):
        event_id = serializers.IntegerField(min_value=1)

    def post(self, request: Request) -> Response:
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        try:
            event = Event.objects.filter(pk=serializer.validated_data["event_id"]).first()
            if event is None:
                raise EventUnknown()
            recap = recap_create(event=event, buyer=_buyer(request))
            checkout = recap_checkout_create(recap=recap, buyer=_buyer(request))
        except CheckoutError as exc:
            # The recap exists and waits for payment; the client retries /checkout/.
            return _error(exc, recap=_recap_data(recap))
        except EventDropError as exc:
            return _error(exc)
        return Response(
            {**_recap_data(recap), "checkout_url": checkout.url},
            status=status.HTTP_201_CREATED,
        )


class RecapDetailApi(_BuyerAPIView):
    def get(self, request: Request, recap_id: str) -> Response:
        try:
            return Response(_recap_data(_own_recap(request, recap_id)))
        except EventDropError as exc:
            return _error(exc)


class RecapCheckoutApi(_BuyerAPIView):
    def post(self, request: Request, recap_id: str) -> Response:
        NoInputSerializer(data=request.data).is_valid(raise_exception=True)
        try:
            recap = _own_recap(request, recap_id)
            checkout = recap_checkout_create(recap=recap, buyer=_buyer(request))
        except EventDropError as exc:
            return _error(exc)
        return Response(
            {"checkout_url": checkout.url, "session_id": checkout.session_id},
            status=status.HTTP_201_CREATED,
        )


class RecapRedeemApi(_BuyerAPIView):
    def post(self, request: Request, recap_id: str) -> Response:
        NoInputSerializer(data=request.data).is_valid(raise_exception=True)
        try:
            recap = recap_redeem_free(recap_id=recap_id, user=_buyer(request))
        except EventDropError as exc:
            return _error(exc)
        return Response(_recap_data(recap))
