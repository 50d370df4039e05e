"""The KServe v2 answers of one server over both protocols, compared field by field:
tritonclient.grpc's ``as_json`` form of a message against tritonclient.http's JSON of
the same call (the HTTP JSON is what Triton's protocol specifies; the gRPC message
must say the same in protobuf's JSON form)."""

from __future__ import annotations

from typing import Any

# model_config.proto's enums at their value 0: proto3 writes no field at its default,
# so the JSON form of the message leaves them out.
ENUM_ZEROS = {"REJECT", "TYPE_INVALID", "KIND_AUTO"}


def _default(value: Any) -> bool:
    return value in (0, "", False, []) or value in ENUM_ZEROS


def diff(http: Any, grpc: Any, extensions: frozenset[str], path: str = "") -> list[str]:
    """Where ``grpc`` (a message's JSON form: int64 as strings, no field at its
    default) does not say what ``http`` says; [] when it says the same.  A key of
    ``extensions`` is HTTP's only (the message has no field for it)."""
    if isinstance(http, dict):
        if not isinstance(grpc, dict):
            return [f"{path}: {grpc!r} is not an object"]
        out = [f"{path}.{k}: only in gRPC" for k in grpc if k not in http]
        for key, value in http.items():
            if key in extensions:
                if key in grpc:
                    out.append(f"{path}.{key}: an extension of the JSON in the message")
            elif key in grpc:
                out += diff(value, grpc[key], extensions, f"{path}.{key}")
            elif isinstance(value, dict) or not _default(value):
                # a message field is written even when empty; a scalar only when set
                out.append(f"{path}.{key}: {value!r} missing in gRPC")
        return out
    if isinstance(http, list):
        if not isinstance(grpc, list) or len(grpc) != len(http):
            return [f"{path}: {grpc!r} != {http!r}"]
        return [
            e
            for i, (h, g) in enumerate(zip(http, grpc))
            for e in diff(h, g, extensions, f"{path}[{i}]")
        ]
    if isinstance(http, bool) or not isinstance(http, int):
        return [] if grpc == http else [f"{path}: {grpc!r} != {http!r}"]
    # int64 / uint64 are strings in protobuf's JSON form, int32 / uint32 numbers
    return [] if str(grpc) == str(http) else [f"{path}: {grpc!r} != {http!r}"]


def config_and_statistics(http: Any, grpc: Any, name: str = "", version: str = "") -> Any:
    """Asserts that ``grpc``'s ModelConfig (when ``name``) and ModelStatistics say what
    ``http``'s do; returns HTTP's statistics.  Call with no inference in flight."""
    from google.protobuf import json_format
    from tritonclient.grpc import model_config_pb2, service_pb2

    pairs = []
    if name:
        pairs.append(
            (
                http.get_model_config(name, version),
                grpc.get_model_config(name, version, as_json=True)["config"],
                model_config_pb2.ModelConfig(),
                frozenset(),
            )
        )
    stats = http.get_inference_statistics(name, version)
    pairs.append(
        (
            stats,
            grpc.get_inference_statistics(name, version, as_json=True),
            service_pb2.ModelStatisticsResponse(),
            frozenset({"specialisations"}),
        )
    )
    for doc, message_json, message, extensions in pairs:
        assert diff(doc, message_json, extensions) == [], (doc, message_json)
        # and as protobuf's own reader takes the HTTP JSON into the message
        json_format.ParseDict(doc, message, ignore_unknown_fields=True)
        assert json_format.MessageToDict(message, preserving_proto_field_name=True) == message_json
    return stats
