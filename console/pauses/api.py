"""Handler pauses in the console API:

    GET  /api/pauses/                  the pauses in force: scope, since, age, held, level
    POST /api/pauses/                  {"handler" or "source": name, "reason": why} -> pause
    POST /api/pauses/resume/           the same body -> resume (release in received order)

Reading needs console.view_ops (the ops page's figures), pausing and resuming operate. Each
change is an operator action, answered as console.api answers every other one.
"""

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from console.api import ConsoleApi, OperatorActionOutputSerializer, operator_action_answer
from console.models import OperatorActionVia
from console.ops.figures import VIEW_OPS_PERMISSION
from console.pauses.services import handlers_pause, handlers_resume, pauses_active
from console.services import acting_user


class PauseScopeSerializer(serializers.Serializer):
    handler = serializers.CharField(required=False, max_length=255, default="")
    source = serializers.CharField(required=False, max_length=64, default="")  # type: ignore[assignment]

    def validate(self, attrs: dict) -> dict:
        if bool(attrs["handler"]) == bool(attrs["source"]):
            raise serializers.ValidationError("Give exactly one of handler and source.")
        return attrs


class PauseInputSerializer(PauseScopeSerializer):
    # Why: shown beside the pause and kept as its operator action's note.
    reason = serializers.CharField(max_length=1000, trim_whitespace=True)


class PausesApi(ConsoleApi):
    required_permission = VIEW_OPS_PERMISSION
    write_permission = "console.operate"


class PauseOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    handler = serializers.CharField()
    # Named after the webhook source (the stubs see Serializer.source, as above).
    source = serializers.CharField()  # type: ignore[assignment]
    paused_at = serializers.DateTimeField()
    age_seconds = serializers.FloatField()
    held = serializers.IntegerField()
    level = serializers.ChoiceField(choices=["green", "yellow", "red"])
    paused_by = serializers.CharField()
    reason = serializers.CharField()


class PauseListApi(PausesApi):
    """Handler pauses in force (GET); pause a handler or a source, saying why (POST)."""

    @extend_schema(responses=PauseOutputSerializer(many=True))
    def get(self, request: Request) -> Response:
        return Response(
            [
                {
                    "id": row.pause.id,
                    "handler": row.pause.handler,
                    "source": row.pause.source,
                    "paused_at": row.pause.paused_at,
                    "age_seconds": row.pause.age_seconds,
                    "held": row.pause.held,
                    "level": row.level,
                    "paused_by": row.actor_username,
                    "reason": row.reason,
                }
                for row in pauses_active()
            ]
        )

    @extend_schema(request=PauseInputSerializer, responses=OperatorActionOutputSerializer)
    def post(self, request: Request) -> Response:
        scope = PauseInputSerializer(data=request.data)
        scope.is_valid(raise_exception=True)
        return operator_action_answer(
            handlers_pause(
                actor=acting_user(request.user), via=OperatorActionVia.API, **scope.validated_data
            )
        )


class PauseResumeApi(PausesApi):
    """Resume a pause, releasing what it held in received order (POST)."""

    @extend_schema(request=PauseScopeSerializer, responses=OperatorActionOutputSerializer)
    def post(self, request: Request) -> Response:
        scope = PauseScopeSerializer(data=request.data)
        scope.is_valid(raise_exception=True)
        return operator_action_answer(
            handlers_resume(
                actor=acting_user(request.user), via=OperatorActionVia.API, **scope.validated_data
            )
        )
