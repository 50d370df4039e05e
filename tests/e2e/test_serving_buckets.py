"""The command line with buckets of sequence lengths: a decoder saved with a -1 sequence
length compiled into a bucketed package and run, equal to the decoder's own dygraph
forward; ``serve`` refuses such a package by name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from serving_models import decoder_reference, save_decoder


def test_compile_and_run_a_bucketed_package_from_the_command_line(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    from paddle_ipu import cli

    prefix, layer = save_decoder(tmp_path)
    package = tmp_path / "lm.pdipu"
    args = ["compile", prefix, "-o", str(package), "--no-cache", "--seq-buckets", "8,4"]
    assert cli.main(args) == 0
    assert "sequence buckets [4, 8]" in capsys.readouterr().out
    ids = np.random.default_rng(12).integers(0, 50, (1, 6)).astype(np.int64)
    np.save(tmp_path / "ids.npy", ids)
    out_dir = tmp_path / "out"
    args = ["run", str(package), "--input", f"input_ids={tmp_path / 'ids.npy'}"]
    assert cli.main([*args, "--output-dir", str(out_dir)]) == 0
    (written,) = out_dir.glob("*.npy")
    np.testing.assert_allclose(
        np.load(written), decoder_reference(layer, ids), rtol=1e-5, atol=1e-5
    )
    assert cli.main(["compile", prefix, "-o", str(package), "--seq-buckets", "4,x"]) == 1
    assert "--seq-buckets must be lengths" in capsys.readouterr().err
    assert cli.main(["serve", str(package), "--seq-buckets", "4"]) == 1
    assert "its buckets were chosen when it was compiled" in capsys.readouterr().err
    # The server's request path checks one fixed shape per tensor: a bucketed package is
    # refused by name before any port is opened (in process, runtime_for serves it).
    assert cli.main(["serve", str(package), "--port", "0"]) == 1
    assert "buckets of sequence lengths over HTTP/gRPC is not supported yet" in (
        capsys.readouterr().err
    )
