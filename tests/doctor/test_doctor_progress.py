"""Progress on stderr (doctor/progress.py): a tqdm bar only on a terminal; elsewhere (a log, a pipe) one line per
phase when it completes, never a carriage return, and nothing from a phase an error cut short."""
import io

from doctor_helpers import cli
from eagle3_capture.doctor.progress import NoBar, PhaseLine, bar


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_one_line_per_phase_off_a_terminal():
    out = io.StringIO()
    b = bar(3, "training the draft", "it", file=out)
    assert isinstance(b, PhaseLine)
    for loss in (3.0, 2.5, 2.25):
        b.set_postfix(loss=f"{loss:.2f}")
        b.update(1)
    b.close()
    line, = out.getvalue().splitlines()
    assert line.startswith("training the draft: 3/3 it in ") and line.endswith(" s, loss 2.25"), line
    cut = io.StringIO()
    b = bar(4, "server", "prompt", file=cut)
    b.update(2)
    b.close()
    assert cut.getvalue() == ""  # an error ended the phase: its one error line stays the only line
    assert "\r" not in out.getvalue()


def test_a_bar_on_a_terminal_and_none_when_off():
    term = Terminal()
    b = bar(2, "server", "prompt", file=term)
    assert type(b).__name__ == "tqdm"
    b.update(2)
    b.close()
    assert isinstance(bar(2, "server", "prompt", enabled=False, file=term), NoBar)


def test_a_command_logs_phases_without_carriage_returns(tmp_path):
    """dump-reference has no --no-progress: in a log its phase is one line, with the one on stdout as before."""
    prompts = tmp_path / "p.json"
    prompts.write_text("[[5, 6, 7, 8], [9, 10, 11]]")
    code, out, err = cli("doctor", "dump-reference", "--model", "demo", "--prompts", prompts, "--out",
                         tmp_path / "ref.safetensors", "--threads", 1)
    assert code == 0, err
    assert "\r" not in err and err.splitlines() == [err.splitlines()[0]] and \
        err.startswith("reference: 2/2 prompts in "), err
    assert out.startswith("wrote ") and "2 prompt(s), 7 tokens" in out, out
