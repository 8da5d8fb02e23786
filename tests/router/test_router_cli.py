"""`fastdeploy router`'s bad input: refused at start-up with a message naming the flag."""

from __future__ import annotations

import pytest
from router_helpers import free_port

from fastdeploy.cli import main


def refusal(capsys, *argv: str) -> str:
    """stderr of `fastdeploy router ARGV`, which must exit 2 without serving."""
    try:
        status = main(["router", "--startup-timeout", "0", "--port", str(free_port()), *argv])
    except SystemExit as exc:  # argparse's own refusals
        status = exc.code
    assert status == 2
    return capsys.readouterr().err


def test_no_reachable_worker_is_refused_naming_workers(capsys):
    nobody = f"http://127.0.0.1:{free_port()}"
    err = refusal(capsys, "--workers", nobody)
    assert f"error: --workers: no reachable worker within 0 s ({nobody}: /health failed: ConnectError" in err


def test_no_worker_at_all_is_refused(capsys):
    assert "error: --workers: no worker address given" in refusal(capsys)


def test_a_malformed_worker_address_is_refused(capsys):
    err = refusal(capsys, "--workers", "http://127.0.0.1:1,localhost:8000")
    assert "error: --workers: 'localhost:8000' is not a worker address (expected http://host:port)" in err


def test_an_unreadable_workers_file_is_refused(capsys, tmp_path):
    err = refusal(capsys, "--workers-file", str(tmp_path / "absent.txt"))
    assert "error: --workers-file: cannot read" in err and "No such file or directory" in err


def test_an_invalid_workers_file_is_refused_with_its_line(capsys, tmp_path):
    listing = tmp_path / "workers.txt"
    listing.write_text("# pool\nworker-1:8000\n")
    assert f"error: --workers-file '{listing}' line 2: 'worker-1:8000' is not a worker address" in refusal(
        capsys, "--workers-file", str(listing)
    )


def test_a_workers_file_with_no_reachable_worker_names_the_file_flag(capsys, tmp_path):
    listing = tmp_path / "workers.txt"
    listing.write_text(f"http://127.0.0.1:{free_port()}\n")
    assert "error: --workers-file: no reachable worker" in refusal(capsys, "--workers-file", str(listing))


@pytest.mark.parametrize("flag", ["--policy", "--health-interval"])
def test_an_unknown_policy_or_bad_number_is_refused_naming_the_flag(capsys, flag):
    value = "fastest" if flag == "--policy" else "-1"
    err = refusal(capsys, "--workers", "http://127.0.0.1:1", flag, value)
    assert f"argument {flag}: " in err and "fastdeploy router" in err


def test_the_router_is_a_listed_subcommand(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "router" in capsys.readouterr().out
