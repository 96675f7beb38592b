"""The bash reader of ``placer check`` against real bash: the same words for the same script.

Each script ends with ``printf '<%s>\\n' WORDS``; bash prints the words it would pass to a
command, and the evaluator must produce exactly those (bash is the independent truth).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from placer.check.shell import ShellSyntaxError, evaluate
from placer.check.shell_arith import arithmetic

BASH = shutil.which("bash")

SCRIPTS = {
    "quoted array elements split when expanded unquoted": (
        'A=("--fp8-format hybrid" "--vocab-size 128256")\nA+=(--x "y z")\n'
        "printf '<%s>\\n' ${A[@]} \"${A[@]}\" \"${A[*]}\" ${#A[@]}\n"),
    "arithmetic with spaces and variables": (
        "GPN=8\nMB=2\nNODES=4\nX=$(( ${GPN} * ${MB} * ${NODES} ))\nY=$((X / 3 - -2 ** 3))\n"
        "printf '<%s>\\n' $X $Y $(( (X > 10) ? 7 : 9 )) $((X % 5)) $((-7 / 2)) $((0x10 + 010))\n"),
    "defaults, assignment defaults and lengths": (
        'E=""\nS=abc\nprintf \'<%s>\\n\' "${U:-d}" "${E:-d}" "${E-d}" "${U:=set}" "$U" '
        '"${#S}" "${S:+alt}" "${S%c}" "${S#a}" "${S^^}" "${S/b/X}"\n'),
    "string variables split, continuations and comments": (
        'OPTS=" \\\n  --tp 4 \\\n  --pp 2"  # comment\nprintf \'<%s>\\n\' $OPTS "$OPTS" x$OPTS\n'),
    "if and case on known values": (
        'M="800M"\ncase "$M" in\n  "800M") TP=1 ;;\n  8B|16B) TP=4 ;;\n  *) exit 1 ;;\nesac\n'
        'if [[ "$TP" -gt 2 ]]; then R=big; elif [ "$M" = "800M" ]; then R=small; else R=no; fi\n'
        '[ -z "$TP" ] && TP=9\nprintf \'<%s>\\n\' $TP $R\n'),
    "export, declare and heredocs": (
        "export A=1 B=2\ndeclare -a ARR=(x y)\ncat <<EOF > /dev/null\nA=99 $(boom)\nEOF\n"
        "printf '<%s>\\n' $A $B ${ARR[1]}\n"),
    "loops over known lists and functions": (
        "S=\nfor n in 1 2 3; do S=$S$n; done\nf() { G=$1; }\nf\nprintf '<%s>\\n' $S\n"),
    "bash -c strings": ('L="--nproc 8"\nbash -c "printf \'<%s>\\n\' $L"\n'),
}


@pytest.mark.skipif(BASH is None, reason="bash not installed")
@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_words_match_real_bash(name: str) -> None:
    script = SCRIPTS[name]
    assert BASH is not None
    out = subprocess.run([BASH, "-c", script], capture_output=True, text=True, timeout=10,
                         env={"PATH": "/usr/bin:/bin"}, check=True).stdout
    expected = [line[1:-1] for line in out.splitlines()]
    words = [w.text for w in evaluate(script).words if w.command == "printf"]
    assert words[2:] == expected  # printf and its format, then the words


def test_unknown_values_are_not_guessed() -> None:
    script = evaluate(
        'N=${SLURM_NNODES:-1}\nH=$(hostname)\nA=("--data $1" "--tp 2")\n'
        'if [ "$N" -gt 1 ]; then TP=8; else TP=4; fi\nif [ -n "$X" ]; then PP=2; fi\n'
        "run ${A[@]} $H\n", runtime=("SLURM_NNODES",))
    assert script.value("N") is None and script.value("H") is None
    assert script.value("TP") is None  # the branches disagree on an unknown condition
    assert [w.text for w in script.words] == ["run", "--data", None, "--tp", "2", None]
    assert any("line 4: condition not known" in note for note in script.notes)
    known = evaluate('N=${SLURM_NNODES:-1}\n', {"SLURM_NNODES": "4"}, ("SLURM_NNODES",))
    assert known.value("N") == "4"


def test_words_in_an_unknown_branch_are_marked() -> None:
    script = evaluate('if [ -f x ]; then\n  run --fp8-format hybrid\nfi\nrun --tp 1\n')
    conditional = {w.text: w.conditional for w in script.words}
    assert conditional["--fp8-format"] == 1 and conditional["--tp"] is None


def test_arithmetic_is_bash_integer_arithmetic() -> None:
    values = {"A": "6", "B": "A*2", "E": ""}.get
    assert arithmetic("A * B", values) == 72  # a variable's value is itself an expression
    assert arithmetic("E + 1", values) == 1
    assert arithmetic("2 ** 63", values) == -(2 ** 63)  # 64-bit wrap-around
    assert arithmetic("UNSET + 1", values) is None
    assert arithmetic("1 / 0", values) is None
    assert arithmetic("__import__('os')", values) is None


def test_runaway_scripts_stop_with_a_reason() -> None:
    nested = "".join(f"for a{k} in 1 2 3 4 5 6 7 8 9 10; do\n" for k in range(6))
    nested += "x=1\n" + "done\n" * 6
    with pytest.raises(ShellSyntaxError, match="more than"):
        evaluate(nested)
    recursive = evaluate("f() { f; }\nf\nrun --tp 2\n")  # bounded depth, then goes on
    assert [w.text for w in recursive.words][-3:] == ["run", "--tp", "2"]


_VALUES = ["8", "2", "", "a b", " x  y ", "--tp 4", "'q'", "*"]
_WORDS = ["$A", '"$A"', "${B:-d}", '"${B:-d}"', "${U:-u v}", "x$A", '"${ARR[@]}"', "${ARR[@]}",
          '"${ARR[*]}"', "${#ARR[@]}", "${#A}", "$((N * M + 1))", "'$A'", '"a$B"c', "${ARR[1]}",
          '"${A%% *}"', "${A#?}", '"${A/ /_}"', "$((${#A} + N))", '"$A"\'$B\'', "${A:+set}",
          "${Z:=z} $Z", '"${ARR[@]:-none}"', "$(( N > M ? N : M ))", "${A^^}"]


@pytest.mark.skipif(BASH is None, reason="bash not installed")
def test_random_scripts_split_like_bash() -> None:
    """Differential test: random assignments and expansions, words compared with bash's."""
    import random
    rng = random.Random(20261201)
    for _ in range(60):
        a, b = rng.choice(_VALUES), rng.choice(_VALUES)
        items = " ".join(f'"{rng.choice(_VALUES)}"' for _ in range(rng.randint(0, 3)))
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 6)))
        script = (f"A='{a}'\nB='{b}'\nN={rng.randint(0, 9)}\nM=$(( {rng.randint(1, 5)} ))\n"
                  f"ARR=({items} x)\nset -f\nprintf '<%s>\\n' START {words} END\n")
        assert BASH is not None
        out = subprocess.run([BASH, "-c", script], capture_output=True, text=True, timeout=10,
                             env={"PATH": "/usr/bin:/bin"}, check=True).stdout
        expected = [line[1:-1] for line in out.splitlines()]
        got = [w.text for w in evaluate(script).words if w.command == "printf"][2:]
        assert got == expected and got[0] == "START" and got[-1] == "END", script


def test_source_reads_a_file_next_to_the_script(tmp_path: Path) -> None:
    (tmp_path / "config.sh").write_text('export ARGS="--tp ${TP}"\nNODES=4\n')
    script = "TP=16\n. `pwd`/config.sh\nsource $PWD/missing.sh\nrun $ARGS\n"
    result = evaluate(script, directory=tmp_path)
    assert [w.text for w in result.words] == ["run", "--tp", "16"]
    # what the sourced file wrote is placed on the line that sources it
    assert result.value("NODES") == "4" and [w.line for w in result.words] == [4, 2, 2]
    assert any("missing.sh is sourced; what it sets is not read" in n for n in result.notes)
    assert evaluate(script).value("NODES") is None  # without the folder nothing is read
