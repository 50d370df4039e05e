"""The ``paddle-ipu`` command (also ``python -m paddle_ipu``)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

DESCRIPTION = (
    "Graphcore IPU support for PaddlePaddle: report the installation, check a backend, "
    "compile saved inference models into packages, run, benchmark and serve them. "
    "Also runs as python -m paddle_ipu."
)


def collect_info() -> dict[str, Any]:
    """What ``paddle-ipu info`` reports, as a dict."""
    import paddle

    import paddle_ipu
    from paddle_ipu import _core, device, patches
    from paddle_ipu.backends import available_backends

    plugin = device.plugin_path()
    return {
        "paddle_ipu": paddle_ipu.__version__,
        "paddle": paddle.__version__,
        "built_against_paddle": _core.paddle_version,
        "plugin": str(plugin) if plugin else None,
        "plugin_root": str(device.plugin_root()),
        "plugin_loaded": device.is_registered(),
        "ipu_device_count": device.device_count(),
        "backends": {
            name: {"available": ok, "detail": detail}
            for name, (ok, detail) in available_backends().items()
        },
        "core": _core.build_info(),
        "patches": patches.report(),
    }


def _print_info(info: dict[str, Any]) -> None:
    rows = [
        ("paddle-ipu", info["paddle_ipu"]),
        ("PaddlePaddle", f"{info['paddle']} (built against {info['built_against_paddle']})"),
        ("ipu plugin", info["plugin"] or f"not found in {info['plugin_root']}"),
        ("plugin loaded by Paddle", "yes" if info["plugin_loaded"] else "no"),
        ("ipu devices", str(info["ipu_device_count"])),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    print("backends:")
    for name, b in info["backends"].items():
        state = "available" if b["available"] else "unavailable"
        detail = f" ({b['detail']})" if b["detail"] else ""
        print(f"  {name:<8} {state}{detail}")
    print("what paddle-ipu changes in this process (paddle_ipu/patches.py):")
    for p in info["patches"]:
        state = "in effect" if p["active"] else "not in effect"
        print(f"  {p['name']} [{p['when']}, {state}]: {p['target']}")
        print(f"      {p['changes']}")
        if p["off"]:
            print(f"      off: {p['off']}")


def progress_printer(stream: Any = None, width: int = 24) -> Callable[[int, int, str], None]:
    """The compile's progress (``paddle-ipu compile``, ``run``, ``serve``): a bar redrawn
    in place on a terminal; one log line per stage otherwise."""
    out = stream if stream is not None else sys.stderr
    tty = bool(getattr(out, "isatty", lambda: False)())
    start = time.perf_counter()

    def show(step: int, total: int, what: str) -> None:
        elapsed = time.perf_counter() - start
        if tty:
            filled = width * step // total
            bar = "#" * filled + "-" * (width - filled)
            end = "\n" if step == total else ""
            out.write(f"\r[{bar}] {step}/{total} {what:<28} {elapsed:6.2f} s{end}")
        else:
            out.write(f"paddle-ipu compile: [{step}/{total}] {what} ({elapsed:.2f} s)\n")
        out.flush()

    return show


def _load_or_compile(
    model: str,
    micro_batch: int,
    quiet: bool = False,
    seq_buckets: Sequence[int] = (),
    pad_values: dict[str, float | str] | None = None,
    input_shapes: Sequence[dict[str, list[int]]] = (),
    max_specialisations: int | None = None,
    shape_buckets: Any = None,
    memory_mb: float | None = None,
) -> Any:
    """A package file, or a saved inference model prefix compiled through the cache."""
    from pathlib import Path

    from paddle_ipu.cli_shapes import bounded
    from paddle_ipu.errors import OptionError
    from paddle_ipu.executor.shapes import DEFAULT_SPECIALISATION_MEMORY_MB as MEMORY_MB
    from paddle_ipu.serving.old_format import resolve
    from paddle_ipu.serving.package import load_package
    from paddle_ipu.serving.saved_model import compile_model

    if Path(model).is_file():
        if seq_buckets or pad_values or input_shapes or shape_buckets is not None:
            raise OptionError(
                f"{model} is a package: its buckets were chosen when it was compiled, as "
                "were its input shapes (--seq-buckets, --shape-buckets, --pad-value and "
                "--input-shapes apply to a saved model prefix)"
            )
        return bounded(load_package(model), max_specialisations, memory_mb)
    package, _ = compile_model(
        resolve(model),  # a __model__ directory too
        micro_batch_size=micro_batch,
        progress=None if quiet else progress_printer(),
        seq_buckets=seq_buckets,
        pad_values=pad_values,
        input_shapes=input_shapes,
        max_specialisations=max_specialisations,
        shape_buckets=shape_buckets,
        memory_mb=MEMORY_MB if memory_mb is None else memory_mb,
    )
    return package


def _refuse_tail(package: Any, why: str) -> None:
    """Refuse a package whose outputs have data-dependent sizes (a host tail) where the
    command needs fixed output shapes, naming the outputs."""
    from paddle_ipu.compiler.tail import DATA_DEPENDENT
    from paddle_ipu.errors import NotSupportedError

    tail = package.tail
    if tail is None:
        return
    sized = [f"{name} {list(shape)}" for name, _, shape in tail.outputs]
    raise NotSupportedError(
        f"the model's outputs {', '.join(sized)} have data-dependent sizes "
        f"({', '.join(sorted(set(tail.ops) & set(DATA_DEPENDENT))) or 'its host tail'} "
        f"runs on the host after the compiled graph), and {why}; run it with paddle-ipu run "
        "or paddle_ipu.inference, or export the detector without NMS (PaddleDetection's "
        "exporter: -o exclude_nms=True)"
    )


def _input_shapes(items: Sequence[str]) -> list[dict[str, list[int]]]:
    """``--input-shapes x:1x3x736x1632,y:1x4`` (repeatable: one graph each) -> shapes."""
    from paddle_ipu.errors import OptionError

    out = []
    for item in items:
        shapes: dict[str, list[int]] = {}
        for part in item.split(","):
            name, sep, dims = part.strip().rpartition(":")
            try:
                if not sep or not name:
                    raise ValueError(part)
                shapes[name] = [int(d) for d in dims.split("x")]
            except ValueError:
                raise OptionError(
                    f"--input-shapes must be NAME:DxDxD[,NAME:DxD...] (-1 for the batch), "
                    f"got {item!r}"
                ) from None
        out.append(shapes)
    return out


def _buckets(text: str | None) -> list[int]:
    """``--seq-buckets 16,32,64`` -> [16, 32, 64]."""
    from paddle_ipu.errors import OptionError

    if not text:
        return []
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise OptionError(
            f"--seq-buckets must be lengths separated by commas (16,32,64), got {text!r}"
        ) from None


def _pad_values(items: Sequence[str]) -> dict[str, float | str]:
    """``--pad-value mask=0`` (repeatable) -> {"mask": 0.0}; shape buckets take ``edge``."""
    from paddle_ipu.errors import OptionError

    out: dict[str, float | str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            if not sep or not name:
                raise ValueError(item)
            out[name] = value if value == "edge" else float(value)
        except ValueError:
            raise OptionError(
                f"--pad-value must be NAME=NUMBER (or NAME=edge), got {item!r}"
            ) from None
    return out


def _cmd_compile(args: argparse.Namespace) -> int:
    from paddle_ipu.cli_shapes import shape_options
    from paddle_ipu.serving.old_format import resolve
    from paddle_ipu.serving.saved_model import compile_model

    t0 = time.perf_counter()
    package, cached = compile_model(
        resolve(args.model_prefix),  # a __model__ directory too
        micro_batch_size=args.micro_batch,
        batches_per_step=args.batches_per_step,
        enable_fp16=args.fp16,
        backend=args.backend,
        cache=not args.no_cache,
        progress=progress_printer(),
        seq_buckets=_buckets(args.seq_buckets),
        pad_values=_pad_values(args.pad_value),
        fp16_black_list=[op for op in (args.fp16_black_list or "").split(",") if op.strip()],
        **shape_options(args, _input_shapes(args.input_shapes)),
    )
    path = package.save(args.output)
    how = "from the compile cache" if cached else "compiled"
    extra = f" (sequence buckets {list(package.sequence.lengths)})" if package.sequence else ""
    if package.per_shape:
        shapes = package.ahead() or "none yet"
        extra = f" (input shapes {shapes}; feeds {package.declared_shapes()})"
    if package.tail is not None:
        tail = package.tail
        extra += f" (outputs {tail.output_names} from a host tail of {len(tail.ops)} operators)"
    print(f"{path}: {how} in {time.perf_counter() - t0:.2f} s{extra}")
    if args.report:
        from paddle_ipu.compiler.memory import memory_report

        graphs = {"": package.model} if package.model is not None else {}
        graphs.update({f"sequence length {n}": m for n, m in package.buckets.items()})
        graphs.update({f"input shapes {k}": m for k, m in package.shapes.items()})
        if not graphs:
            print("memory: no graph compiled yet (compiled per input shape on first use)")
        for label, model in graphs.items():
            print(f"{label}:" if label else "", end="\n" if label else "")
            print(memory_report(model, package.strategy().values()).text())
    return 0


def _parse_inputs(items: Sequence[str]) -> dict[str, Any]:
    import numpy as np

    from paddle_ipu.errors import FeedError

    feed: dict[str, Any] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise FeedError(f"--input must be NAME=file.npy, got {item!r}")
        try:
            feed[name] = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise FeedError(f"--input {name}: cannot read {path!r} as a .npy file: {exc}") from exc
    return feed


def _cmd_run(args: argparse.Namespace) -> int:
    import numpy as np

    from paddle_ipu.serving.bucketed_runtime import runtime_for
    from paddle_ipu.serving.package import load_package

    package = load_package(args.package)
    feed = _parse_inputs(args.input)
    options = _host_options(args)
    with runtime_for(
        package, args.backend, timeout_ms=0.001, compiled_outputs=True, executor_options=options
    ) as runtime:
        outputs = runtime.run(feed)
        names = [s.paddle_name or s.name for s in runtime.executor.model.outputs]
    if package.tail is not None:  # data-dependent outputs: the host tail gives them
        outputs = package.tail.run(feed, outputs)
        names = package.tail.output_names
    for name, value in zip(names, outputs):
        if args.output_dir:
            from pathlib import Path

            target = Path(args.output_dir) / f"{name}.npy"
            target.parent.mkdir(parents=True, exist_ok=True)
            np.save(target, value)
            print(f"{name}: {list(value.shape)} {value.dtype} -> {target}")
        else:
            print(f"{name}: {list(value.shape)} {value.dtype}")
            print(np.array2string(value, threshold=50, precision=6))
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    import threading

    import numpy as np

    from paddle_ipu.serving.bucketed_runtime import runtime_for
    from paddle_ipu.serving.package import load_package

    package = load_package(args.package)
    _refuse_tail(package, "the bench times the compiled graph's fixed outputs")
    rng = np.random.default_rng(0)
    if package.model is None:
        from paddle_ipu.errors import OptionError

        raise OptionError(
            f"{args.package} holds no compiled input shape to load it with: compile it with "
            "--input-shapes"
        )
    specs = package.model.inputs

    def request(rows: int) -> dict[str, Any]:
        feed = {}
        for s in specs:
            shape = (rows, *s.shape[1:])
            if np.dtype(s.dtype).kind in "iu":
                hi = min((r.high for r in s.ranges), default=2)
                feed[s.paddle_name or s.name] = rng.integers(0, max(hi, 1), shape).astype(s.dtype)
            else:
                feed[s.paddle_name or s.name] = rng.standard_normal(shape).astype(s.dtype)
        return feed

    # a package of sequence buckets: requests of the longest compiled length
    runtime = runtime_for(
        package, args.backend, timeout_ms=args.timeout_ms, executor_options=_host_options(args)
    )
    feeds = [request(args.rows) for _ in range(64)]
    print(
        f"{args.package}: micro-batch {package.options['micro_batch_size']}, "
        f"{args.rows}-row requests, timeout {args.timeout_ms:g} ms, {args.seconds:g} s per row"
    )
    print(f"{'clients':>8} {'req/s':>9} {'rows/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'rows/run':>9}")
    try:
        for _ in range(20):
            runtime.run(feeds[0])
        for clients in args.clients:
            lat: list[float] = []
            lock = threading.Lock()
            stop = time.perf_counter() + args.seconds
            before = runtime.stats()

            def client(
                c: int, stop: float = stop, lat: list[float] = lat, lock: Any = lock
            ) -> None:
                mine = []
                i = c
                while time.perf_counter() < stop:
                    t = time.perf_counter()
                    runtime.run(feeds[i % len(feeds)])
                    mine.append(time.perf_counter() - t)
                    i += 1
                with lock:
                    lat.extend(mine)

            t0 = time.perf_counter()
            threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.perf_counter() - t0
            after = runtime.stats()
            runs = max(after.runs - before.runs, 1)
            lat.sort()
            p50 = lat[len(lat) // 2] * 1e3
            p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1e3
            n = len(lat)
            print(
                f"{clients:8d} {n / wall:9.0f} {n * args.rows / wall:9.0f} {p50:8.3f} {p99:8.3f} "
                f"{(after.units - before.units) / runs:9.2f}"
            )
    finally:
        runtime.close()
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from paddle_ipu.cli_shapes import shape_options
    from paddle_ipu.errors import OptionError
    from paddle_ipu.serving.bucketed_runtime import runtime_for
    from paddle_ipu.serving.server import InferenceServer

    if args.workers < 1:
        raise OptionError(f"--workers must be >= 1, got {args.workers}")
    if (args.model is None) == (args.model_repository is None):
        raise OptionError(
            "serve takes a model (a package or a saved model prefix) or "
            "--model-repository DIR, one of the two"
        )
    if args.model_repository is not None:
        return _serve_repository(args)
    if args.model_control_mode != "none" or args.load_model:
        raise OptionError("--model-control-mode and --load-model apply to --model-repository")
    if args.workers > 1:
        return _serve_workers(args)
    if args.metrics_port is not None:
        raise OptionError(
            "--metrics-port gathers the metrics of --workers > 1 processes; one process "
            "answers GET /metrics on --port itself"
        )
    package = _load_or_compile(
        args.model,
        args.micro_batch,
        seq_buckets=_buckets(args.seq_buckets),
        pad_values=_pad_values(args.pad_value),
        **shape_options(args, _input_shapes(args.input_shapes)),
    )
    _refuse_tail(package, _SERVE_WHY)
    # The host backend's threads sleep between runs: spinning would take the cores the
    # IO threads and the gRPC server need (measured: about 2x the requests/s).
    runtime = runtime_for(
        package,
        args.backend,
        executor_options={"host_spin_threads": args.spin, **_host_options(args)},
        timeout_ms=args.timeout_ms,
        num_buffers=args.num_buffers,
    )
    # A package of sequence buckets or compiled per input shape is a dynamic model: its
    # requests are parsed in C++ and handed to the runtime's submit (serving/dynamic.py).
    server = InferenceServer(
        runtime, name=args.name, instances=args.instances or 1, **_server_options(args)
    )
    sock = None
    if args.worker_metrics_socket:  # a --workers process: the parent gathers its metrics
        from paddle_ipu.serving.workers import WorkerMetricsSocket

        sock = WorkerMetricsSocket(args.worker_metrics_socket, server.prometheus)
    try:
        server.serve_forever()
    finally:
        if sock is not None:
            sock.close()
    return 0


_SERVE_WHY = (
    "the server answers each request with tensors of the shapes it declares in the "
    "model's metadata (the C++ request path lays every answer out before the run)"
)


def _server_options(args: argparse.Namespace) -> dict[str, Any]:
    """The InferenceServer options ``serve`` takes from its command line, whatever it
    serves (one model or a repository)."""
    return {
        "host": args.host,
        "port": args.port,
        "grpc_port": args.grpc_port,
        "threads": args.threads,
        "request_timeout_ms": args.request_timeout_ms,
        "max_body_mb": args.max_body_mb,
        "reuse_port": args.reuse_port,
        "access_log": args.access_log,
        "warmup": args.warmup,
        "drain_grace_s": args.drain_grace_s,
        "header_timeout_s": args.header_timeout_s,
        "idle_timeout_s": args.idle_timeout_s,
        "max_connections": args.max_connections,
        "max_header_kb": args.max_header_kb,
        "max_headers": args.max_headers,
    }


def _serve_repository(args: argparse.Namespace) -> int:
    """``--model-repository DIR``: every model of a directory in Triton's layout, in
    one process (paddle_ipu/serving/repository.py)."""
    from paddle_ipu.errors import OptionError
    from paddle_ipu.serving.repository import ModelRepository
    from paddle_ipu.serving.server import InferenceServer

    if (
        args.workers > 1
        or args.metrics_port is not None
        or args.seq_buckets
        or args.input_shapes
        or args.pad_value
        or args.shape_buckets is not None
        or args.max_specialisations is not None
        or args.specialisation_memory_mb is not None
    ):
        raise OptionError(
            "--model-repository takes --workers 1 (no --metrics-port), and no --seq-buckets, "
            "--shape-buckets, --pad-value, --input-shapes, --max-specialisations or "
            "--specialisation-memory-mb (a model's options are in its config.json)"
        )
    repository = ModelRepository(
        args.model_repository,
        control_mode=args.model_control_mode,
        load=args.load_model,
        micro_batch_size=args.micro_batch,
        timeout_ms=args.timeout_ms,
        num_buffers=args.num_buffers,
        backend=args.backend,
        spin=args.spin,
        host_options=_host_options(args),
    )
    InferenceServer(repository=repository, **_server_options(args)).serve_forever()
    return 0


def _serve_workers(args: argparse.Namespace) -> int:
    """``--workers N``: the model compiled (or the cache filled) once, then N worker
    processes (paddle_ipu/serving/supervisor.py)."""
    from paddle_ipu.cli_shapes import shape_argv, shape_options
    from paddle_ipu.errors import OptionError
    from paddle_ipu.serving.supervisor import supervise

    if args.port == 0 or args.grpc_port == 0:
        raise OptionError("--workers > 1 needs fixed ports: every worker listens on the same ones")
    package = _load_or_compile(
        args.model,
        args.micro_batch,
        seq_buckets=_buckets(args.seq_buckets),
        pad_values=_pad_values(args.pad_value),
        **shape_options(args, _input_shapes(args.input_shapes)),
    )
    _refuse_tail(package, _SERVE_WHY)
    from paddle_ipu.serving.workers import worker_argv

    argv = worker_argv(args) + shape_argv(args)
    return supervise(argv, args.workers, args.host, args.metrics_port)


def _cmd_cache(args: argparse.Namespace) -> int:
    from paddle_ipu.serving.cache import cache_clear, cache_dir, cache_entries

    if args.action == "clear":
        print(f"removed {cache_clear()} entries from {cache_dir()}")
        return 0
    entries = cache_entries()
    total = sum(e.size for e in entries)
    print(f"{cache_dir()}: {len(entries)} entries, {total / (1 << 20):.1f} MiB")
    for e in entries:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.last_used))
        print(f"  {e.key[:16]}  {e.size / (1 << 20):8.2f} MiB  {when}  {e.source}")
    return 0


#: the host backend's options on run, bench and serve: name -> (choices, help)
_HOST = {
    "precision": (
        ("float32", "bfloat16"),
        "bfloat16: matmuls and convolutions in bfloat16 on "
        "OpenVINO, for a CPU with AVX512-BF16 or AMX (the openvino extra)",
    ),
    "engine": (
        ("auto", "onnxruntime", "openvino"),
        "what runs the graph (auto: the faster, measured once per model)",
    ),
}


def _host_arguments(p: argparse.ArgumentParser) -> None:
    for name, (choices, text) in _HOST.items():
        p.add_argument(f"--{name}", choices=choices, default=choices[0], help=f"host: {text}")


def _host_options(args: argparse.Namespace) -> dict[str, Any]:
    return {f"host_{name}": getattr(args, name) for name in _HOST}


def _bucket_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--seq-buckets",
        metavar="L1,L2,...",
        help="compile one graph per sequence length (a -1 dimension besides the batch); "
        "requests are padded to the shortest that holds them",
    )
    p.add_argument(
        "--pad-value",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="what a feed is padded with up to its bucket (0 by default), e.g. "
        "attention_mask=0, or NAME=edge (its edge repeated: --shape-buckets)",
    )
    p.add_argument(
        "--input-shapes",
        action="append",
        default=[],
        metavar="NAME:DxD...[,NAME:DxD...]",
        help="a model whose feeds leave dimensions open besides the batch compiles one graph "
        "per input shape: compile this one now (repeatable; -1 for the batch); other shapes "
        "are compiled when a request brings them",
    )
    p.add_argument(
        "--max-specialisations",
        type=int,
        default=None,
        metavar="N",
        help="how many input shapes such a model keeps in memory at once (default: as many "
        "as --specialisation-memory-mb holds)",
    )
    from paddle_ipu.cli_shapes import add_shape_arguments

    add_shape_arguments(p)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="paddle-ipu", description=DESCRIPTION)
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p_info = sub.add_parser("info", help="report Paddle, the ipu plugin, devices and backends")
    p_info.add_argument("--json", action="store_true", help="print JSON")

    p = sub.add_parser("selftest", help="run the backend checks and print a report")
    p.add_argument("--backend", default="auto", help="host, popart or auto (default)")

    p = sub.add_parser("compile", help="compile a saved inference model into a portable package")
    p.add_argument(
        "model_prefix", help="a save_inference_model path prefix (or a __model__ directory)"
    )
    p.add_argument("-o", "--output", required=True, help="the package file to write")
    p.add_argument("--micro-batch", type=int, default=1, help="rows per micro-batch (1)")
    p.add_argument("--batches-per-step", type=int, default=1)
    p.add_argument("--fp16", action="store_true", help="run the graph in float16")
    p.add_argument(
        "--fp16-black-list",
        metavar="OP[,OP...]",
        help="with --fp16, Paddle operators that compute in float32 (softmax, layer_norm ...)",
    )
    p.add_argument("--backend", default="host", choices=("host", "popart"))
    p.add_argument("--no-cache", action="store_true", help="bypass the compile cache")
    p.add_argument(
        "--report",
        action="store_true",
        help="print the memory the model needs on each IPU, against the IPU's",
    )
    _bucket_arguments(p)

    p = sub.add_parser("run", help="run a package once on inputs from .npy files")
    p.add_argument("package")
    p.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy")
    p.add_argument("--output-dir", help="write each output to NAME.npy here")
    p.add_argument("--backend", default=None, choices=("host", "popart", "auto"))
    _host_arguments(p)

    p = sub.add_parser("bench", help="latency and throughput of a package under load")
    p.add_argument("package")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16, 32])
    p.add_argument("--rows", type=int, default=1, help="rows per request (1)")
    p.add_argument("--seconds", type=float, default=2.0, help="per row of the table (2)")
    p.add_argument("--timeout-ms", type=float, default=2.0)
    p.add_argument("--backend", default=None, choices=("host", "popart", "auto"))
    _host_arguments(p)

    p = sub.add_parser(
        "serve", help="serve a model over HTTP and gRPC (KServe v2 / Triton protocol)"
    )
    p.add_argument("model", nargs="?", help="a package file, or a saved inference model prefix")
    p.add_argument(
        "--model-repository",
        metavar="DIR",
        help="serve every model of DIR, in Triton's layout: DIR/<model>/<version>/model.pdipu "
        "(or model.json + model.pdiparams), DIR/<model>/config.json (see docs/serving.md)",
    )
    p.add_argument(
        "--model-control-mode",
        choices=("none", "explicit"),
        default="none",
        help="none: load every model at start, refuse load/unload requests; explicit: "
        "load/unload on request (none)",
    )
    p.add_argument(
        "--load-model",
        action="append",
        default=[],
        metavar="NAME",
        help="in explicit mode, a model to load at start (repeatable)",
    )
    p.add_argument("--port", type=int, default=8000, help="HTTP port (8000)")
    p.add_argument("--grpc-port", type=int, default=None, help="also serve gRPC on this port")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--workers", type=int, default=1, help="server processes sharing the ports (1)")
    p.add_argument("--threads", type=int, default=1, help="IO threads per process (1)")
    p.add_argument(
        "--request-timeout-ms",
        type=float,
        default=0.0,
        help="answer 504 to a request not started within this time (0: no limit)",
    )
    p.add_argument("--max-body-mb", type=float, default=64.0, help="largest request body (64)")
    p.add_argument(
        "--access-log",
        nargs="?",
        const="-",
        default=None,
        metavar="PATH",
        help="one JSON line per inference request, appended to PATH (no PATH: stderr)",
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=0,
        help="graph runs made before readiness turns 200 (0)",
    )
    p.add_argument(
        "--drain-grace-s",
        type=float,
        default=0.0,
        help="on SIGTERM: readiness 503 at once, listeners close after this long (0)",
    )
    # The bounds on clients (docs/serving.md#limits-and-timeouts: nginx's and Envoy's).
    for flag, kind, default, text in (
        ("--header-timeout-s", float, 60.0, "a request's headers must come within (60; 0: none)"),
        ("--idle-timeout-s", float, 75.0, "close connections idle or stalled this long (75)"),
        ("--max-connections", int, 1024, "open connections at most; more are refused (1024)"),
        ("--max-header-kb", int, 64, "a request's header block at most, KiB (64)"),
        ("--max-headers", int, 100, "a request's header fields at most (100)"),
    ):
        p.add_argument(flag, type=kind, default=default, help=text)
    p.add_argument(
        "--spin",
        action="store_true",
        help="let the host backend's threads spin between runs (off: they sleep)",
    )
    p.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)
    # A --workers process: how many serve the model (the configuration's instance_group),
    # and where the parent asks for its metrics (--metrics-port).
    p.add_argument("--instances", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--worker-metrics-socket", default=None, help=argparse.SUPPRESS)
    p.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="with --workers: every worker's /metrics in one scrape on this port",
    )
    p.add_argument("--name", default="model", help="the model name in URLs (model)")
    p.add_argument("--micro-batch", type=int, default=16, help="when compiling a prefix (16)")
    p.add_argument("--timeout-ms", type=float, default=2.0, help="batching timeout (2)")
    p.add_argument("--num-buffers", type=int, default=64, help="micro-batches in flight (64)")
    p.add_argument("--backend", default=None, choices=("host", "popart", "auto"))
    _host_arguments(p)
    _bucket_arguments(p)

    p = sub.add_parser("cache", help="the compile cache: ls or clear")
    p.add_argument("action", choices=("ls", "clear"))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        from paddle_ipu._version import __version__

        print(f"paddle-ipu {__version__}")
        return 0
    if args.command is None:
        parser.print_help()
        return 0
    if args.command == "selftest":
        from paddle_ipu.backends import selftest

        return selftest.main(["--backend", args.backend])
    if args.command == "info":
        info = collect_info()
        if args.json:
            json.dump(info, sys.stdout, indent=2)
            print()
        else:
            _print_info(info)
        return 0 if info["plugin_loaded"] else 1
    from paddle_ipu.errors import IpuError

    commands = {
        "compile": _cmd_compile,
        "run": _cmd_run,
        "bench": _cmd_bench,
        "serve": _cmd_serve,
        "cache": _cmd_cache,
    }
    try:
        return commands[args.command](args)
    except IpuError as exc:
        print(f"paddle-ipu {args.command}: error: {exc}", file=sys.stderr)
        return 1
