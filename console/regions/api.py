"""The regions in the API (docs/multi-region.md): who processes, what each region has
acknowledged, the replication lag per direction; and the operator's switch of the
processing region (an audited action, console/regions/services.py)."""

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from console.api import ConsoleApi, OperatorActionOutputSerializer, operator_action_answer
from console.models import OperatorActionVia
from console.ops.figures import VIEW_OPS_PERMISSION
from console.regions.services import processing_region_switch
from console.services import acting_user
from regions.configuration import multi_region, peers, region_name
from regions.models import RegionState
from regions.selectors import effective_decision, replication_lags
from regions.services import ONE_REGION, UNKNOWN_REGION


class RegionsApi(ConsoleApi):
    required_permission = VIEW_OPS_PERMISSION
    write_permission = "console.operate"


class RegionOutputSerializer(serializers.Serializer):
    name = serializers.CharField()
    heartbeat_at = serializers.DateTimeField(allow_null=True)
    seen_epoch = serializers.IntegerField()
    lease_until = serializers.DateTimeField(allow_null=True)
    lease_epoch = serializers.IntegerField()


class LagOutputSerializer(serializers.Serializer):
    source = serializers.CharField()  # type: ignore[assignment]
    target = serializers.CharField()
    seconds = serializers.FloatField(allow_null=True)
    connected = serializers.BooleanField()


class RegionsOutputSerializer(serializers.Serializer):
    region = serializers.CharField()
    processing_region = serializers.CharField(allow_null=True)
    epoch = serializers.IntegerField()
    regions = RegionOutputSerializer(many=True)
    lags = LagOutputSerializer(many=True)


class ProcessingRegionInputSerializer(serializers.Serializer):
    region = serializers.CharField(max_length=32)
    reason = serializers.CharField(max_length=1000)
    peer_lost = serializers.BooleanField(default=False)

    def validate_region(self, value: str) -> str:
        # Bad input, refused before anything is recorded; the service checks again.
        if not multi_region():
            raise serializers.ValidationError(ONE_REGION)
        if value not in {region_name(), *(peer.name for peer in peers())}:
            raise serializers.ValidationError(UNKNOWN_REGION.format(region=value))
        return value


class RegionListApi(RegionsApi):
    """The regions: who processes from which epoch, each region's heartbeat, acknowledged
    epoch and lease, and the replication lag per direction."""

    @extend_schema(responses=RegionsOutputSerializer)
    def get(self, request: Request) -> Response:
        decision = effective_decision()
        return Response(
            RegionsOutputSerializer(
                {
                    "region": region_name(),
                    "processing_region": decision.processing_region if decision else None,
                    "epoch": decision.epoch if decision else 0,
                    "regions": RegionState.objects.order_by("name"),
                    "lags": replication_lags(timezone.now()),
                }
            ).data
        )


class ProcessingRegionApi(RegionsApi):
    """Switch the processing region, saying why; `peer_lost`: the takeover (POST)."""

    @extend_schema(
        request=ProcessingRegionInputSerializer, responses=OperatorActionOutputSerializer
    )
    def post(self, request: Request) -> Response:
        given = ProcessingRegionInputSerializer(data=request.data)
        given.is_valid(raise_exception=True)
        return operator_action_answer(
            processing_region_switch(
                actor=acting_user(request.user), via=OperatorActionVia.API, **given.validated_data
            )
        )
