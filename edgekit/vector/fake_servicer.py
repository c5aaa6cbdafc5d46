"""The gRPC half of :class:`~edgekit.vector.fake.FakeVector`: bearer check and servicer.

The servicer is built from the SDK's own generated ``ExternalInterfaceServicer``: the RPCs
the SDK's connect sequence, camera, speech and face need each have one small function
here (``_HANDLERS``); every other unary call is acknowledged with an empty OK response.
Every call is counted in ``robot.calls``. The handlers read and write FakeVector's state
under its lock; this module is FakeVector's own, not a public API.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from typing import Any

from edgekit.errors import BackendUnavailable
from edgekit.vector.face import decode_rgb565

# A FakeVector. Not imported, not even for type checking: fake.py imports this module, and
# the import graph stays acyclic.
_Robot = Any


def import_grpc() -> Any:
    """The ``grpc`` module, or BackendUnavailable with an install hint."""
    try:
        import grpc
    except ImportError as exc:  # pragma: no cover - grpcio comes with the SDK
        raise BackendUnavailable("FakeVector needs grpcio", "pip install 'edgekit-vision[vector]'") from exc
    return grpc


def sdk_modules() -> tuple[Any, Any, Any]:
    """The SDK's ``protocol``, ``external_interface_pb2`` and ``external_interface_pb2_grpc``."""
    try:
        from anki_vector.messaging import external_interface_pb2, external_interface_pb2_grpc, protocol
    except ImportError as exc:
        raise BackendUnavailable(
            "FakeVector needs the Vector SDK's messages (module anki_vector)", "pip install 'edgekit-vision[vector]'"
        ) from exc
    return protocol, external_interface_pb2, external_interface_pb2_grpc


def bearer_check(robot: _Robot) -> Any:
    """A server interceptor refusing every call without ``authorization: Bearer <guid>``, as
    the robot does (the SDK turns the status into VectorUnauthenticatedException)."""
    grpc = import_grpc()
    # (request_streaming, response_streaming) -> the matching handler factory
    factories = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }

    def deny(request, context):
        context.abort(grpc.StatusCode.UNAUTHENTICATED, "invalid or missing bearer token")

    def deny_stream(request, context):
        deny(request, context)
        yield from ()

    class BearerCheck(grpc.ServerInterceptor):
        def intercept_service(self, continuation, handler_call_details):
            handler = continuation(handler_call_details)
            metadata = dict(handler_call_details.invocation_metadata or ())
            if handler is None or metadata.get("authorization") == f"Bearer {robot.guid}":
                return handler
            make = factories[(handler.request_streaming, handler.response_streaming)]
            return make(
                deny_stream if handler.response_streaming else deny,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )

    return BearerCheck()


def add_servicer(server: Any, robot: _Robot) -> None:
    """Register a servicer built from the SDK's generated ExternalInterfaceServicer."""
    protocol, pb2, pb2_grpc = sdk_modules()
    handlers = {**_HANDLERS, **(getattr(robot, "handlers", None) or {})}
    methods = {name: _bind(name, handler, robot, protocol) for name, handler in handlers.items()}
    service = pb2.DESCRIPTOR.services_by_name["ExternalInterface"]
    for method in service.methods:
        if method.client_streaming or method.server_streaming or method.name in methods:
            continue
        methods[method.name] = _acknowledge(method.name, getattr(protocol, method.output_type.name), robot, protocol)
    servicer_cls = type("FakeVectorServicer", (pb2_grpc.ExternalInterfaceServicer,), methods)
    pb2_grpc.add_ExternalInterfaceServicer_to_server(servicer_cls(), server)


_Handler = Callable[[_Robot, Any, Any, Any], Any]


def _bind(name: str, handler: _Handler, robot: _Robot, protocol: Any) -> Callable:
    """A servicer method calling ``handler(robot, protocol, request, context)``.

    A streaming handler returns its generator; grpc iterates whatever the method returns.
    """

    def method(self, request, context):
        robot._record(name)
        return handler(robot, protocol, request, context)

    method.__name__ = name
    return method


def _acknowledge(name: str, response_cls: Any, robot: _Robot, protocol: Any) -> Callable:
    def method(self, request, context):
        robot._record(name)
        return _status_ok(protocol, response_cls)

    method.__name__ = name
    return method


def _status_ok(protocol: Any, message_cls: Any) -> Any:
    msg = message_cls()
    if "status" in message_cls.DESCRIPTOR.fields_by_name:
        msg.status.CopyFrom(_ok(protocol))
    return msg


def _ok(protocol: Any) -> Any:
    return protocol.ResponseStatus(code=protocol.ResponseStatus.OK)


# ---- one function per RPC the fake answers for real ----------------------------------


def _protocol_version(robot: _Robot, protocol: Any, request: Any, context: Any) -> Any:
    return protocol.ProtocolVersionResponse(
        result=protocol.ProtocolVersionResponse.SUCCESS, host_version=protocol.PROTOCOL_VERSION_CURRENT
    )


def _behavior_control(robot: _Robot, protocol: Any, request_iterator: Any, context: Any) -> Iterator[Any]:
    try:
        for req in request_iterator:
            kind = req.WhichOneof("request_type")
            if kind == "control_request" and robot.grant_control:
                granted = protocol.ControlGrantedResponse()
                yield protocol.BehaviorControlResponse(control_granted_response=granted)
            elif kind == "control_release":
                yield protocol.BehaviorControlResponse(control_lost_event=protocol.ControlLostResponse())
    except Exception:  # noqa: BLE001, S110 - the client went away; a robot just drops the stream
        return


def _event_stream(robot: _Robot, protocol: Any, request: Any, context: Any) -> Iterator[Any]:
    done = robot._call_event(context)
    try:
        # the SDK's connect() waits for one robot_state (it reads the pose from it)
        while True:
            state = protocol.RobotState(pose=protocol.PoseStruct(q0=1.0), head_angle_rad=0.0)
            yield protocol.EventResponse(status=_ok(protocol), event=protocol.Event(robot_state=state))
            if done.wait(0.5):
                return
    finally:
        robot._forget(done)


def _camera_feed(robot: _Robot, protocol: Any, request: Any, context: Any) -> Iterator[Any]:
    done = robot._call_event(context)
    frames, n = robot._frames, len(robot._frames)
    period = 1.0 / robot.fps
    with robot._lock:
        robot._streaming += 1
    try:
        t0 = time.monotonic()
        for k in itertools.count():
            if not robot.loop and k >= n:
                done.wait()  # camera stays on, nothing new: a covered lens
                return
            # absolute deadlines, so the rate does not drift with send time
            if done.wait(max(0.0, t0 + k * period - time.monotonic())):
                return
            image_id = next(robot._image_ids)
            with robot._lock:
                robot.frames_sent += 1
                robot.last_image_id = image_id
            if not robot.loop and k == n - 1:
                robot.exhausted.set()
            yield protocol.CameraFeedResponse(
                frame_time_stamp=int(time.monotonic() * 1000) & 0xFFFFFFFF,
                image_id=image_id,
                image_encoding=protocol.ImageChunk.JPEG_COLOR,
                data=frames[k % n],
            )
    finally:
        with robot._lock:
            robot._streaming -= 1
        robot._forget(done)


def _is_image_streaming_enabled(robot: _Robot, protocol: Any, request: Any, context: Any) -> Any:
    with robot._lock:
        on = robot._streaming > 0
    return protocol.IsImageStreamingEnabledResponse(is_image_streaming_enabled=on)


def _get_camera_config(robot: _Robot, protocol: Any, request: Any, context: Any) -> Any:
    # the numbers a real Vector reports (fov ~ 90 x 50 degrees)
    return protocol.CameraConfigResponse(
        focal_length_x=290.0, focal_length_y=290.0, center_x=320.0, center_y=180.0,
        fov_x=1.5708, fov_y=0.8727, min_camera_exposure_time_ms=1, max_camera_exposure_time_ms=67,
        min_camera_gain=0.1, max_camera_gain=3.9,
    )  # fmt: skip


def _say_text(robot: _Robot, protocol: Any, request: Any, context: Any) -> Any:
    if robot.say_delay_s:
        time.sleep(robot.say_delay_s)
    with robot._lock:
        robot.said.append(request.text)
    return protocol.SayTextResponse(status=_ok(protocol), state=protocol.SayTextResponse.FINISHED)


def _display_face_image_rgb(robot: _Robot, protocol: Any, request: Any, context: Any) -> Any:
    try:
        image = decode_rgb565(request.face_data)
    except ValueError as exc:
        context.abort(import_grpc().StatusCode.INVALID_ARGUMENT, str(exc))
    with robot._lock:
        robot.shown.append(image)
    return _status_ok(protocol, protocol.DisplayFaceImageRGBResponse)


_HANDLERS: dict[str, _Handler] = {
    "ProtocolVersion": _protocol_version,
    "BehaviorControl": _behavior_control,
    "EventStream": _event_stream,
    "CameraFeed": _camera_feed,
    "IsImageStreamingEnabled": _is_image_streaming_enabled,
    "GetCameraConfig": _get_camera_config,
    "SayText": _say_text,
    "DisplayFaceImageRGB": _display_face_image_rgb,
}
