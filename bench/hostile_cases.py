"""The cases of bench/hostile_probe.py: hostile clients of a KServe v2 server (raw
HTTP/1.1 bytes, JSON and binary-extension bodies, raw HTTP/2 frames and protobuf bytes
on the gRPC port, slow and stalled clients, floods).  Each case is (family, name,
function of the server -> what came back), the server having ``port``, ``grpc_port``.
"""

from __future__ import annotations

import contextlib
import json
import random
import socket
import struct
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

INFER = "/inference.GRPCInferenceService/ModelInfer"
HEADER_TIMEOUT_S, IDLE_TIMEOUT_S, MAX_CONNECTIONS = 2, 3, 200
Case = tuple[str, str, Callable[[Any], str]]


# -- clients ---------------------------------------------------------------------------


def send(port: int, data: bytes, timeout: float = 15.0, half_close: bool = True) -> str:
    """Raw bytes; the first answer's status line, or how the connection ended."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(data)
            if half_close:
                s.shutdown(socket.SHUT_WR)
            got = b""
            while b"\r\n" not in got:
                chunk = s.recv(65536)
                if not chunk:
                    return "closed" if not got else "partial"
                got += chunk
            line = got.split(b"\r\n", 1)[0].split()
            return f"http {line[1].decode(errors='replace')}" if len(line) > 1 else "garbage"
    except TimeoutError:
        return "no answer"
    except OSError as exc:
        return f"socket {type(exc).__name__}"


def post(path: str, body: bytes, *headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: p", f"Content-Length: {len(body)}", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def binary(doc: dict[str, Any], blob: bytes, length: str | None = None) -> bytes:
    head = json.dumps(doc).encode()
    return post(
        "/v2/models/m/infer", head + blob, f"Inference-Header-Content-Length: {length or len(head)}"
    )


def grpc_unary(port: int, message: bytes, timeout: float = 15.0) -> str:
    import grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            channel.unary_unary(INFER)(message, timeout=timeout)
            return "grpc OK"
        except grpc.RpcError as exc:
            return f"grpc {exc.code().name}"


def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return (
        struct.pack(">I", len(payload))[1:]
        + bytes([kind, flags])
        + struct.pack(">I", stream)
        + payload
    )


def hpack(headers: list[tuple[str, str]]) -> bytes:
    """Literal header fields without indexing, no Huffman (RFC 7541 6.2.2)."""
    out = b""
    for name, value in headers:
        out += b"\x00"
        for text in (name.encode(), value.encode()):
            n = len(text)
            out += bytes([n]) if n < 127 else bytes([127]) + _varint7(n - 127)
            out += text
    return out


def _varint7(n: int) -> bytes:
    out = b""
    while n >= 128:
        out += bytes([n & 127 | 128])
        n >>= 7
    return out + bytes([n])


PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0, b"")


def h2(port: int, frames: bytes, timeout: float = 15.0) -> str:
    """Raw HTTP/2 on the gRPC port: what came back (frame types) or how it ended."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(frames)
            got = b""
            deadline = time.monotonic() + 3
            s.settimeout(0.5)
            while time.monotonic() < deadline:
                try:
                    chunk = s.recv(65536)
                except TimeoutError:
                    continue
                if not chunk:
                    break
                got += chunk
            types, at = set(), 0
            while at + 9 <= len(got):
                types.add(
                    {0: "DATA", 1: "HEADERS", 3: "RST", 4: "SETTINGS", 6: "PING", 7: "GOAWAY"}.get(
                        got[at + 3], "?"
                    )
                )
                at += 9 + int.from_bytes(got[at : at + 3], "big")
            return "h2 " + "+".join(sorted(types)) if types else "h2 nothing"
    except OSError as exc:
        return f"socket {type(exc).__name__}"


def grpc_call_frames(message: bytes, *extra: tuple[str, str]) -> bytes:
    headers = [(":method", "POST"), (":scheme", "http"), (":path", INFER), (":authority", "p")]
    headers += [("content-type", "application/grpc"), ("te", "trailers"), *extra]
    data = b"\0" + len(message).to_bytes(4, "big") + message
    return PREFACE + frame(1, 4, 1, hpack(headers)) + frame(0, 1, 1, data)


# -- the cases ------------------------------------------------------------------------

HUGE = [
    [1099511627776, 1],
    [2305843009213693953, 1],
    [2**62, 4],
    [4, 2**62],
    [0, 2**62],
    [0, 2**40],
    [2**31, 2**31],
    [65536, 65536],
    [2**63 - 1],
    [1, 2**40],
]


def request_message(
    shape: list[int], raw: bytes | None, datatype: str = "FP32", **kw: Any
) -> bytes:
    from tritonclient.grpc import service_pb2

    r = service_pb2.ModelInferRequest(model_name=kw.pop("model", "m"), **kw)
    t = r.inputs.add(name="x", datatype=datatype, shape=shape)
    if raw is not None:
        r.raw_input_contents.append(raw)
    else:
        t.contents.fp32_contents.extend([0.5] * 4)
    return bytes(r.SerializeToString())


def http_cases(good: np.ndarray) -> list[Case]:
    good_json = json.dumps(
        {
            "inputs": [
                {"name": "x", "shape": list(good.shape), "datatype": "FP32", "data": good.tolist()}
            ]
        }
    ).encode()
    raws: list[tuple[str, bytes]] = [
        ("empty", b""),
        ("crlf", b"\r\n\r\n"),
        ("no version", b"GET /\r\n\r\n"),
        ("http/9", b"GET / HTTP/9.9\r\n\r\n"),
        ("nul", b"\0" * 100),
        ("binary junk", bytes(range(256)) * 4),
        ("long target", b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n"),
        ("negative length", b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: -1\r\n\r\n"),
        (
            "2**64 length",
            b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: 18446744073709551616\r\n\r\n",
        ),
        (
            "length over limit",
            b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: 999999999999\r\n\r\n",
        ),
        (
            "length and chunked",
            b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: 5\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        ),
        (
            "huge chunk",
            b"POST /v2/models/m/infer HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"ffffffffffffffff\r\nab",
        ),
        (
            "bad chunk",
            b"POST /v2/models/m/infer HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        ),
        (
            "chunk ext flood",
            b"POST /v2/models/m/infer HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1;"
            + b"a=b;" * 20000
            + b"\r\nx\r\n0\r\n\r\n",
        ),
        ("bare lf", b"GET /v2/health/ready HTTP/1.1\nHost: p\n\n"),
        ("obs fold", b"GET /v2/health/ready HTTP/1.1\r\nX: a\r\n b\r\n\r\n"),
        ("nul header", b"GET /v2/health/ready HTTP/1.1\r\nX: a\0b\r\n\r\n"),
        ("no colon", b"GET /v2/health/ready HTTP/1.1\r\nXab\r\n\r\n"),
        (
            "101 headers",
            b"GET /v2/health/ready HTTP/1.1\r\n"
            + b"".join(b"X-%d: 1\r\n" % i for i in range(101))
            + b"\r\n",
        ),
        (
            "3000 headers",
            b"GET /v2/health/ready HTTP/1.1\r\n"
            + b"".join(b"X-%d: 1\r\n" % i for i in range(3000))
            + b"\r\n",
        ),
        ("70 KB header", b"GET /v2/health/ready HTTP/1.1\r\nX: " + b"a" * 70000 + b"\r\n\r\n"),
        ("dup length", post("/v2/models/m/infer", good_json, f"Content-Length: {len(good_json)}")),
        ("dup host", post("/v2/models/m/infer", good_json, "Host: q")),
        (
            "dup binary length",
            post(
                "/v2/models/m/infer",
                good_json,
                *[f"Inference-Header-Content-Length: {len(good_json)}"] * 2,
            ),
        ),
        ("pipelined junk", post("/v2/models/m/infer", good_json) + b"\0\0GARBAGE\r\n\r\n"),
        (
            "expect then close",
            b"POST /v2/models/m/infer HTTP/1.1\r\nExpect: 100-continue\r\n"
            b"Content-Length: 10\r\n\r\n",
        ),
    ]
    for path in (
        "//",
        "/v2/models//infer",
        "/v2/models/m/versions//infer",
        "/v2/health/ready/",
        "/v2/models/m/../m/infer",
        "/v2/models/%00/infer",
        "*",
        "http://p/v2/health/ready",
        "/v2/models/" + "m" * 60000 + "/infer",
        "/v2/models/m/versions/" + "9" * 100 + "/infer",
        "/v2/repository/models/m/unload",
        "/v2/models/m/stats?x",
    ):
        raws.append((f"path {path[:30]}", post(path, good_json)))
    for method in ("DELETE", "OPTIONS", "CONNECT", "TRACE", "PATCH", "X" * 200):
        raws.append(
            (
                f"method {method[:10]}",
                f"{method} /v2/models/m/infer HTTP/1.1\r\nHost: p\r\n\r\n".encode(),
            )
        )
    out: list[Case] = [("http bytes", n, lambda s, d=d: send(s.port, d)) for n, d in raws]

    def infer(doc: Any) -> Callable[[Any], str]:
        body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
        return lambda s: send(s.port, post("/v2/models/m/infer", body))

    x = {"name": "x", "datatype": "FP32"}
    for shape in [*HUGE, [-1, 16], [1.5, 16], ["a"], [], [[1]], [2**64], None, {}]:
        for data in ([], [0.5], None):
            item = dict(x, shape=shape, **({"data": data} if data is not None else {}))
            out.append(("json shapes", f"{shape} {data}", infer({"inputs": [item]})))
    for dtype in (
        "FP32x",
        "",
        None,
        5,
        "BYTES",
        "BF16",
        "INT64",
        "BOOL",
        "FP16",
        "UINT8",
        "STRING",
    ):
        out.append(
            (
                "json datatypes",
                str(dtype),
                infer(
                    {
                        "inputs": [
                            dict(x, datatype=dtype, shape=list(good.shape), data=good.tolist())
                        ]
                    }
                ),
            )
        )
    n = good.size
    datas: list[tuple[str, bytes]] = [
        ("1e400", b"1e400"),
        ("-1e400", b"-1e400"),
        ("3.5e38", b"3.5e38"),
        ("true", b"true"),
        ("string", b'"x"'),
        ("null", b"null"),
        ("object", b"{}"),
        ("2**64", b"18446744073709551616"),
        ("nan word", b"NaN"),
        ("deep", b"[" * 40 + b"1" + b"]" * 40),
        ("deeper", b"[" * 100000),
        ("ragged", b"[[1,2,3],[4]]"),
        ("mixed", b"[[1,2],3]"),
    ]
    for name, value in datas:
        items = b",".join([value] * n) if not value.startswith(b"[") else value
        body = b'{"inputs":[{"name":"x","shape":%s,"datatype":"FP32","data":[%s]}]}' % (
            json.dumps(list(good.shape)).encode(),
            items,
        )
        out.append(("json values", name, infer(body)))
    good_item = {"name": "x", "shape": list(good.shape), "datatype": "FP32", "data": good.tolist()}
    for name, params in (
        ("timeout 1e16", {"timeout": 10**16}),
        ("timeout max", {"timeout": 2**63 - 1}),
        ("timeout -1", {"timeout": -1}),
        ("timeout float", {"timeout": 1.5}),
        ("timeout str", {"timeout": "x"}),
        ("priority", {"priority": 5}),
        ("unknown", {"x": 1}),
        ("binary str", {"binary_data_output": "yes"}),
        ("not object", 5),
    ):
        out.append(("json parameters", name, infer({"inputs": [good_item], "parameters": params})))
    for name, outputs in (
        ("unknown", [{"name": "q"}]),
        ("twice", [{"name": "y"}] * 2),
        ("not list", 5),
        ("no name", [{}]),
        ("binary str", [{"name": "q", "parameters": {"binary_data": "x"}}]),
    ):
        out.append(("json outputs", name, infer({"inputs": [good_item], "outputs": outputs})))
    for name, doc in (
        ("not json", b"{nope"),
        ("array", b"[]"),
        ("no inputs", b"{}"),
        ("inputs obj", b'{"inputs":{}}'),
        ("input twice", {"inputs": [good_item, good_item]}),
        ("unknown input", {"inputs": [dict(good_item, name="z")]}),
        ("10k inputs", {"inputs": [good_item] * 10000}),
        ("id obj", {"inputs": [good_item], "id": {}}),
    ):
        out.append(("json documents", name, infer(doc)))
    blob = good.tobytes()
    bx = {
        "name": "x",
        "shape": list(good.shape),
        "datatype": "FP32",
        "parameters": {"binary_data_size": len(blob)},
    }
    for name, length in (
        ("-1", "-1"),
        ("huge", "99999999999999999999"),
        ("abc", "abc"),
        ("past body", str(10**6)),
        ("0", "0"),
        ("space", " 5"),
    ):
        out.append(
            (
                "binary",
                f"header length {name}",
                lambda s, length=length: send(s.port, binary({"inputs": [bx]}, blob, length)),
            )
        )
    for name, size in (
        ("-1", -1),
        ("2**62", 2**62),
        ("1.5", 1.5),
        ("str", "8"),
        ("short", len(blob) - 4),
        ("long", len(blob) + 4),
    ):
        doc = {"inputs": [dict(bx, parameters={"binary_data_size": size})]}
        out.append(("binary", f"size {name}", lambda s, doc=doc: send(s.port, binary(doc, blob))))
    for shape in HUGE:
        for dtype, nbytes in (("FP64", 8), ("FP32", 4), ("FP16", 2), ("BOOL", 1)):
            doc = {
                "inputs": [
                    {
                        "name": "x",
                        "shape": shape,
                        "datatype": dtype,
                        "parameters": {"binary_data_size": nbytes},
                    }
                ]
            }
            out.append(
                (
                    "binary shapes",
                    f"{dtype} {shape}",
                    lambda s, doc=doc, n=nbytes: send(s.port, binary(doc, b"\1" * n)),
                )
            )
    f64 = np.array([[1e300] * good.shape[1]] * good.shape[0])
    doc = {
        "inputs": [
            {
                "name": "x",
                "shape": list(good.shape),
                "datatype": "FP64",
                "parameters": {"binary_data_size": f64.nbytes},
            }
        ]
    }
    out.append(("binary", "FP64 past FP32", lambda s: send(s.port, binary(doc, f64.tobytes()))))
    return out


def grpc_cases(good: np.ndarray, valid: bytes) -> list[Case]:
    rng = random.Random(5)
    out: list[Case] = []
    for i in range(40):
        junk = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300)))
        out.append(("grpc bytes", f"random {i}", lambda s, j=junk: grpc_unary(s.grpc_port, j)))
    for cut in range(0, len(valid), max(1, len(valid) // 25)):
        out.append(
            ("grpc bytes", f"cut at {cut}", lambda s, c=cut: grpc_unary(s.grpc_port, valid[:c]))
        )
    for i in range(40):
        flipped = bytearray(valid)
        for _ in range(rng.randrange(1, 4)):
            flipped[rng.randrange(len(flipped))] = rng.randrange(256)
        out.append(
            ("grpc bytes", f"flipped {i}", lambda s, f=bytes(flipped): grpc_unary(s.grpc_port, f))
        )
    for shape in HUGE:
        for dtype, raw in (
            ("FP64", b"\0" * 8),
            ("FP32", b""),
            ("FP32", None),
            ("BYTES", b"\xff\xff\xff\x7fab"),
        ):
            msg = request_message(shape, raw, dtype)
            out.append(
                (
                    "grpc shapes",
                    f"{dtype} {shape} {'typed' if raw is None else len(raw)}",
                    lambda s, m=msg: grpc_unary(s.grpc_port, m),
                )
            )
    for name, kw in (("timeout 1e16", 10**16), ("timeout max", 2**63 - 1), ("timeout -1", -1)):
        from tritonclient.grpc import service_pb2

        r = service_pb2.ModelInferRequest.FromString(valid)
        r.parameters["timeout"].int64_param = kw
        message = bytes(r.SerializeToString())
        out.append(
            (
                "grpc parameters",
                name,
                lambda s, m=message: grpc_unary(s.grpc_port, m),
            )
        )
    for name, kw in (
        ("model 1 MB", {"model": "m" * (1 << 20)}),
        ("version x", {"model_version": "x" * 1000}),
        ("unknown model", {"model": "q"}),
    ):
        msg = request_message(list(good.shape), good.tobytes(), **kw)
        out.append(("grpc names", name, lambda s, m=msg: grpc_unary(s.grpc_port, m)))
    frames: list[tuple[str, bytes]] = [
        ("bad preface", b"GET / HTTP/1.1\r\n\r\n"),
        ("preface only", PREFACE),
        ("settings flood", PREFACE + frame(4, 0, 0, b"\0\3\0\0\0\1") * 5000),
        ("ping flood", PREFACE + frame(6, 0, 0, b"\0" * 8) * 5000),
        (
            "rst flood",
            PREFACE
            + b"".join(
                frame(1, 5, 2 * i + 1, hpack([(":method", "POST"), (":path", INFER)]))
                + frame(3, 0, 2 * i + 1, b"\0\0\0\x08")
                for i in range(1000)
            ),
        ),
        ("window overflow", PREFACE + frame(8, 0, 0, b"\x7f\xff\xff\xff") * 3),
        ("window zero", PREFACE + frame(8, 0, 0, b"\0\0\0\0")),
        ("continuation alone", PREFACE + frame(9, 4, 1, b"\0")),
        ("bad hpack", PREFACE + frame(1, 5, 1, b"\xff" * 20)),
        ("huge frame", PREFACE + struct.pack(">I", 0xFFFFFF)[1:] + b"\0\0\0\0\0\1"),
        ("data on idle stream", PREFACE + frame(0, 1, 7, b"abc")),
        (
            "1000 streams",
            PREFACE
            + b"".join(
                frame(
                    1,
                    4,
                    2 * i + 1,
                    hpack(
                        [
                            (":method", "POST"),
                            (":scheme", "http"),
                            (":path", INFER),
                            (":authority", "p"),
                            ("content-type", "application/grpc"),
                        ]
                    ),
                )
                for i in range(1000)
            ),
        ),
        (
            "continuation flood",
            PREFACE
            + frame(1, 0, 1, hpack([(":method", "POST")]))
            + frame(9, 0, 1, hpack([("x", "y")])) * 5000,
        ),
        ("grpc-timeout 99999999H", grpc_call_frames(valid, ("grpc-timeout", "99999999H"))),
        ("grpc-timeout bad", grpc_call_frames(valid, ("grpc-timeout", "1x"))),
        ("150 metadata", grpc_call_frames(valid, *[(f"x-{i}", "v") for i in range(150)])),
        (
            "compressed",
            PREFACE
            + frame(
                1,
                4,
                1,
                hpack(
                    [(":method", "POST"), (":path", INFER), ("content-type", "application/grpc")]
                ),
            )
            + frame(0, 1, 1, b"\1\0\0\0\0"),
        ),
        (
            "prefix lies",
            PREFACE
            + frame(
                1,
                4,
                1,
                hpack(
                    [(":method", "POST"), (":path", INFER), ("content-type", "application/grpc")]
                ),
            )
            + frame(0, 1, 1, b"\0\xff\xff\xff\xff"),
        ),
    ]
    out += [("http2 frames", n, lambda s, f=f: h2(s.grpc_port, f)) for n, f in frames]
    return out


def slow_cases(good: np.ndarray) -> list[Case]:
    def loris(s: Any) -> str:
        socks = [socket.create_connection(("127.0.0.1", s.port)) for _ in range(100)]
        line = b"POST /v2/models/m/infer HTTP/1.1\r\nHost: p\r\nX: "
        closed, t0 = 0, time.monotonic()
        for i in range(int((HEADER_TIMEOUT_S + 3) / 0.25)):
            for c in socks:
                with contextlib.suppress(OSError):
                    c.send(line[i : i + 1] if i < len(line) else b"a")
            time.sleep(0.25)
        for c in socks:
            c.settimeout(5)
            try:
                while c.recv(65536):
                    pass
                closed += 1
            except OSError:
                pass
            c.close()
        return f"{closed}/100 closed within {time.monotonic() - t0:.0f} s"

    def idle(s: Any) -> str:
        socks = [
            socket.create_connection(("127.0.0.1", p))
            for p in (s.port, s.grpc_port)
            for _ in range(50)
        ]
        t0, closed = time.monotonic(), 0
        for c in socks:
            c.settimeout(IDLE_TIMEOUT_S + 10)
            try:
                while c.recv(65536):
                    pass
                closed += 1
            except OSError:
                pass
            c.close()
        return f"{closed}/100 closed within {time.monotonic() - t0:.0f} s"

    def stalled_body(s: Any) -> str:
        with socket.create_connection(("127.0.0.1", s.port), timeout=IDLE_TIMEOUT_S + 10) as c:
            c.sendall(b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: 100\r\n\r\n{")
            return (c.recv(65536).split(b"\r\n", 1)[0] or b"closed").decode()

    def bound(s: Any) -> str:
        socks = []
        statuses: Counter[str] = Counter()
        for _ in range(MAX_CONNECTIONS + 20):
            socks.append(socket.create_connection(("127.0.0.1", s.port)))
        time.sleep(0.5)
        for c in socks[-20:]:
            c.settimeout(5)
            try:
                statuses[c.recv(64).split(b"\r\n", 1)[0].decode()] += 1
            except OSError as exc:
                statuses[type(exc).__name__] += 1
        for c in socks:
            c.close()
        time.sleep(0.5)
        return ", ".join(f"{v} {k}" for k, v in statuses.items())

    return [
        ("slow clients", "slow-loris x100", loris),
        ("slow clients", "idle x100", idle),
        ("slow clients", "stalled body", stalled_body),
        ("slow clients", "max connections + 20", bound),
    ]
