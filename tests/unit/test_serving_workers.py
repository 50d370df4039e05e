"""The merge of the --workers processes' Prometheus texts (serving/workers.py), read
back with prometheus_client's own parser."""

from __future__ import annotations

import pytest

from paddle_ipu.serving.workers import merge_prometheus

parser = pytest.importorskip("prometheus_client.parser")

TEXT = """# HELP paddle_ipu_requests_total Inference requests by outcome (HTTP status).
# TYPE paddle_ipu_requests_total counter
paddle_ipu_requests_total{model="m",version="1",status="200"} {ok}
# HELP paddle_ipu_batch_size Units (rows) per graph run.
# TYPE paddle_ipu_batch_size histogram
paddle_ipu_batch_size_bucket{model="m",version="1",le="1"} {ok}
paddle_ipu_batch_size_bucket{model="m",version="1",le="+Inf"} {ok}
paddle_ipu_batch_size_sum{model="m",version="1"} {ok}
paddle_ipu_batch_size_count{model="m",version="1"} {ok}
# HELP plain_gauge A sample without labels.
# TYPE plain_gauge gauge
plain_gauge {ok}
"""


def test_each_family_once_with_every_worker_labelled() -> None:
    texts = [TEXT.replace("{ok}", "3"), None, TEXT.replace("{ok}", "5")]
    families = {f.name: f for f in parser.text_string_to_metric_families(merge_prometheus(texts))}
    up = {s.labels["worker"]: s.value for s in families["paddle_ipu_worker_up"].samples}
    assert up == {"0": 1.0, "1": 0.0, "2": 1.0}
    requests = families["paddle_ipu_requests"]
    assert requests.type == "counter"
    assert [(s.labels["worker"], s.labels["status"], s.value) for s in requests.samples] == [
        ("0", "200", 3.0),
        ("2", "200", 5.0),
    ]
    batch = families["paddle_ipu_batch_size"]
    assert batch.type == "histogram" and len(batch.samples) == 8
    assert {s.labels["worker"] for s in batch.samples} == {"0", "2"}
    plain = families["plain_gauge"]
    assert [(s.labels, s.value) for s in plain.samples] == [
        ({"worker": "0"}, 3.0),
        ({"worker": "2"}, 5.0),
    ]
    assert merge_prometheus(texts).count("# TYPE paddle_ipu_batch_size histogram") == 1
