"""The command line, run as a user would run it."""

import re

from cli_runner import run_cli


def test_demo_prints_weights_that_sum_to_one():
    result = run_cli("demo", "--length", "4", "--dim", "3")
    assert result.returncode == 0, result.stderr
    assert "weights" in result.stdout and "Key-value lookup" in result.stdout


def test_key_value_lookup_in_demo_returns_the_matching_value():
    result = run_cli("demo")
    assert result.returncode == 0, result.stderr
    lookup = result.stdout.split("Key-value lookup")[1].split("output")[1]
    numbers = [float(x) for x in re.findall(r"-?\d+\.\d*", lookup.split("3. Causal")[0])]
    # Query = key 0 returns value 0 = [0, 1, 2, 3]; query = key 2 averages values 2 and 3.
    assert numbers == [0, 1, 2, 3, 10, 11, 12, 13]


def test_bad_arguments_exit_nonzero_with_one_line():
    result = run_cli("demo", "--length", "0")
    assert result.returncode != 0
    assert "--length and --dim must be at least 1" in result.stderr
    assert "Traceback" not in result.stderr


def test_no_command_prints_help():
    result = run_cli()
    assert result.returncode == 2 and "demo" in result.stdout
