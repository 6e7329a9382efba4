"""The ``eagle3-capture doctor`` command line: its argparse subcommands, and one wiring for all of them
(:func:`run_command`): the flags, each checked by its type (``arg_types``) before any work, become the command's
typed ``Options``; ``run`` returns a report; ``--json`` gets ``report.to_json()``; stdout gets ``render(report)``; the
exit code is ``exit_code(report)`` (the commands: ``commands/``).

Exit codes: 0 fine, 1 an error finding (check) or a failed result, 2 bad input (a
:class:`~eagle3_capture.doctor.common.DoctorError` or a :class:`~eagle3_capture.dump_format.DumpError`, printed on one
line without a traceback, like argparse's own usage errors).
"""
from __future__ import annotations

import dataclasses
import sys
import types
from types import ModuleType
from typing import Optional

from . import arg_types as at
from .bounds import MAX_TIMEOUT_S
from .common import EXIT_BAD_INPUT, EXIT_FINDINGS, DeploymentFinding, DoctorError, write_json

SERVER_ARGS_HELP = ("SGLang launch flags, quoted as one string (e.g. \"--speculative-algorithm EAGLE3 "
                    "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4\"); a whole "
                    "launch_server command line works too; flags the doctor does not model are ignored")


def command_module(name: str) -> ModuleType:
    """The subcommand's module, imported only when it runs (``check`` then loads no torch)."""
    if name == "check":
        from .commands import check as mod
    elif name == "fingerprint":
        from .commands import fingerprint as mod
    elif name == "dump-reference":
        from .commands import dump_reference as mod
    elif name == "accept":
        from .commands import accept as mod
    elif name == "online":
        from .commands import online as mod
    elif name == "demo":
        from .commands import demo as mod
    elif name == "watch":
        from .commands import watch as mod
    else:  # pragma: no cover - argparse allows only the names above
        raise ValueError(f"unknown doctor subcommand {name!r}")
    return mod


def run_command(args) -> int:
    """Every subcommand the same way: its flags -> the command's typed Options -> run -> the report to --json (when
    the command has one) -> render on stdout -> its exit code."""
    mod = command_module(args.doctor_command)
    opts = mod.Options(**{f.name: getattr(args, f.name) for f in dataclasses.fields(mod.Options)})
    rep = mod.run(opts)
    if getattr(opts, "json", None):
        write_json(opts.json, rep.to_json())
    print(mod.render(rep))
    return mod.exit_code(rep)


def _one_line_error(self, message: str):
    """argparse's error, as one line: ``<prog>: error: <message>`` (no usage block), exit 2."""
    self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def one_line_errors(parser) -> None:
    parser.error = types.MethodType(_one_line_error, parser)


# Options several subcommands take, added in place (argparse parents would list them first in every --help).
def _add_device_threads(s, threads_default=None, threads_help="CPU threads") -> None:
    """--device and --threads of a subcommand that runs models."""
    s.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda")
    s.add_argument("--threads", type=at.THREADS, default=threads_default, help=threads_help)


def _add_json(s, help: str) -> None:
    s.add_argument("--json", metavar="OUT.json", type=at.output_file, help=help)


def _add_no_progress(s, help: str = "no progress (a bar on a terminal, else one line on stderr per phase)") -> None:
    s.add_argument("--no-progress", action="store_true", help=help)


def _add_seed(s, help: Optional[str] = None) -> None:
    s.add_argument("--seed", type=at.seed, default=0, help=help)


def _add_target_checkpoint(s) -> None:
    s.add_argument("--target-checkpoint", metavar="DIR",
                   help="without --target: the target's checkpoint directory; only its config, tokenizer and the "
                        "tensors the draft lacks (embed_tokens, lm_head) are read, each alone from the shard that "
                        "model.safetensors.index.json names -- never the whole model")


def _add_dtype(s) -> None:
    s.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto",
                   help="the draft's dtype (default auto: float32 beside --target and on the CPU, bfloat16 on a GPU "
                        "without --target)")


def _add_profile_out(s) -> None:
    s.add_argument("--profile-out", metavar="PROFILE.json", type=at.output_file,
                   help="write the expected-acceptance profile (per draft position, from the predicted histogram of "
                        "correct drafts, with the server flags) for the plugin's EAGLE3_CAPTURE_PROFILE and `doctor "
                        "watch --profile`")


def _add_server_args(s, help: str = SERVER_ARGS_HELP) -> None:
    s.add_argument("--server-args", metavar="\"FLAGS\"", help=help)


def add_doctor_parser(sub) -> None:
    """Register ``doctor`` and its subcommands on the top-level subparsers."""
    doc = sub.add_parser(
        "doctor", help="check configs and server flags, fingerprint captures, measure offline acceptance, watch a server, "
             "demo",
        description="Find why a served EAGLE-3 draft accepts less than it should: configs and server flags "
                    "(check), what a server really captured (fingerprint), the draft's offline accuracy and the "
                    "accept length SGLang will serve (accept), a running server beside that prediction (online), its "
                    "acceptance live from /metrics (watch); `demo` runs all of it on a tiny built-in pair.")
    one_line_errors(doc)
    ds = doc.add_subparsers(dest="doctor_command", required=True, metavar="{check,fingerprint,dump-reference,accept,online,demo,watch}")

    s = ds.add_parser("check", help="trained taps vs what stock SGLang (any release 0.5.8-0.5.23) or vLLM / the plugin "
                                    "capture, config and flag traps",
                      description="Reads the target and draft config.json, says which taps the draft was trained on "
                                  "(in every convention), what stock SGLang (the release given, else the installed "
                                  "one, else the newest modelled) or stock vLLM (--engine vllm) and this project's "
                                  "plugin capture, what other SGLang releases would capture from the same ids, "
                                  "every inconsistency and server-flag trap, each with a fix; with --reference and "
                                  "--captured also fingerprints what a server captured. Exit 1 on an error finding.")
    s.add_argument("--target-config", required=True, metavar="PATH", help="target config.json (or its directory)")
    s.add_argument("--draft-config", required=True, metavar="PATH", help="EAGLE-3 draft config.json (or its directory)")
    _add_server_args(s)
    s.add_argument("--reference", metavar="REF.safetensors", help="reference hidden states (doctor dump-reference)")
    s.add_argument("--captured", metavar="CAP", help="what the server captured: the plugin's EAGLE3_CAPTURE_DUMP "
                                                     "directory or file, or a safetensors capture")
    s.add_argument("--with-plugin", action="store_true",
                   help="the server runs this project's SGLang plugin: stock SGLang's capture problems become info")
    s.add_argument("--engine", type=at.engine, default="sglang", metavar="{sglang,vllm}",
                   help="the serving engine whose reading of the configs to model (default sglang)")
    s.add_argument("--sglang-version", type=at.sglang_version, metavar="X",
                   help="the SGLang release the server runs, 0.5.8 .. 0.5.23 (.post releases included); default: the "
                        "installed SGLang, else the newest modelled")
    s.add_argument("--vllm-version", type=at.vllm_version, metavar="X",
                   help="with --engine vllm: the vLLM release (0.33.0, 0.34.0); default: the installed vLLM, else "
                        "the newest modelled")
    _add_json(s, "also write the report as JSON")

    s = ds.add_parser("fingerprint", help="which layer each captured slot holds (a reference, the server's own stream, "
                                          "or training data)",
                      description="Compares each captured slot with every reference hidden state by mean cosine "
                                  "similarity over the tokens, names the layer each slot matches and whether it is the "
                                  "declared one. The reference is a transformers model's hidden states "
                                  "(--reference, from dump-reference), or, without one, the server's own residual "
                                  "stream in its dump (the doctor's requests; EAGLE3_CAPTURE_DUMP_STREAM=all names any "
                                  "layer). With --training-data (SpecForge's .ckpt samples) it says, on the same token "
                                  "ids, whether the server captures what training used, slot by slot, and which layer "
                                  "each training slot was. A match is called ambiguous when the best layer does not "
                                  "beat the next by more than two captures of one tap differ. Declared taps come from "
                                  "--taps, --draft-config + --target-config, or the dump. Exit 1 when a slot is not "
                                  "the declared tap (or the server does not capture what training used).")
    s.add_argument("--reference", metavar="REF.safetensors", help="from doctor dump-reference (leave out to use the "
                                                                   "server's own stream)")
    s.add_argument("--captured", required=True, metavar="CAP",
                   help="the plugin's capture dump (EAGLE3_CAPTURE_DUMP file or directory) or a safetensors capture")
    s.add_argument("--training-data", metavar="DIR",
                   help="SpecForge offline training data (rows_*/data_*.ckpt: input_ids, loss_mask, hidden_state, "
                        "aux_hidden_state) to compare with what the server captures on the same token ids")
    s.add_argument("--server", metavar="URL", type=at.url,
                   help="with --training-data: send the samples' token ids to this server "
                                                   "first (as the doctor's requests, whose stream the plugin dumps to "
                                                   "--captured)")
    _add_target_checkpoint(s)
    s.add_argument("--samples", type=at.POSITIVE, default=None, help="training samples to use (default 8)")
    s.add_argument("--max-tokens", type=at.POSITIVE, default=None,
                   help="tokens of each sample to use (default 512: a full-stream dump is L+1 rows of H per token)")
    s.add_argument("--timeout", type=at.finite_float(0.0, MAX_TIMEOUT_S, low_open=True), default=120.0,
                   help="seconds to wait for the server's answers and dump (default 120)")
    s.add_argument("--draft-config", metavar="PATH", help="declared taps from this draft config")
    s.add_argument("--target-config", metavar="PATH", help="target config (with --draft-config)")
    s.add_argument("--taps", metavar="CONV:IDS", help="declared taps, e.g. draft_ids:-1,2,30 or layer_inputs:0,3,31")
    s.add_argument("--min-cos", type=at.finite_float(-1.0, 1.0), default=0.95,
                   help="below this a slot matches nothing (default 0.95)")
    _add_json(s, "also write the table as JSON")

    s = ds.add_parser("dump-reference", help="the training side's hidden states for some prompts (transformers)",
                      description="Runs a transformers model on the prompts and writes every hidden state (the HF "
                                  "hidden_states stack, whose last entry is post-norm, plus the final boundary taken "
                                  "before the final norm by a hook) to a safetensors file for doctor fingerprint.")
    s.add_argument("--model", required=True, metavar="PATH|demo", help="transformers model directory, or 'demo'")
    s.add_argument("--prompts", required=True, metavar="FILE",
                   help="prompts: .json list (strings or token-id lists), .jsonl, or text with one prompt a line")
    s.add_argument("--out", required=True, metavar="REF.safetensors", type=at.output_file)
    s.add_argument("--new-tokens", type=at.NON_NEGATIVE, default=0,
                   help="also append the model's greedy continuation of this many tokens (default 0)")
    s.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                   help="storage dtype of the hidden states (computed in the model's dtype)")
    _add_device_threads(s)
    _add_seed(s, "seed of the demo model (with --model demo)")

    s = ds.add_parser("accept", help="offline draft accuracy per step and the accept length SGLang will serve",
                      description="Runs the target's greedy continuation of each prompt and the draft's chain at "
                                  "every position, as a server would (draft fc through the project's op): top-1 "
                                  "agreement per draft step, teacher-forced and conditional on the earlier steps; "
                                  "the served accept length (completion tokens / verifies along SGLang 0.5.23's own "
                                  "loop, chain or tree, per prompt and in total: the figure to compare with a "
                                  "server's); and tau = 1 + sum_k prod_(i<=k) acc_i over every position (not a "
                                  "served figure).")
    s.add_argument("--target", metavar="PATH|demo", help="transformers model directory, or 'demo' (or instead: "
                                                          "--hidden-states)")
    s.add_argument("--hidden-states", metavar="DUMP",
                   help="instead of --target: a dump of the server's own residual stream for the doctor's "
                        "teacher-forced requests (the EAGLE3_CAPTURE_DUMP directory of a `doctor online --dump` "
                        "run); the continuation is each request's tokens after its prompt (the server's greedy "
                        "output) and the target's greedy token after position t is the token at t+1")
    s.add_argument("--draft", required=True, metavar="PATH",
                   help="EAGLE-3 draft directory (config.json + *.safetensors): LlamaForCausalLMEagle3 (SpecForge) or "
                        "Eagle3DeepseekV2ForCausalLM (MLA)")
    _add_target_checkpoint(s)
    s.add_argument("--prompts", required=True, metavar="FILE", help="as for dump-reference")
    _add_server_args(s)
    s.add_argument("--taps", metavar="CONV:IDS",
                   help="feed these taps instead of the declared ones (predict a miswired server), e.g. "
                        "layer_inputs:3,31,59")
    s.add_argument("--new-tokens", type=at.int_at_least(2), default=None,
                   help="continuation tokens per prompt (default 64 with --target; with --hidden-states, as many as "
                        "the dumped requests hold)")
    s.add_argument("--steps", type=at.POSITIVE, default=None,
                   help="draft steps to measure (default: the chain length, >= 3; not fewer than the chain length)")
    s.add_argument("--batch-size", type=at.POSITIVE, default=8)
    _add_device_threads(s)
    _add_dtype(s)
    _add_json(s, "write the report as JSON")
    s.add_argument("--tensors", metavar="OUT.safetensors", type=at.output_file,
                   help="write per-position results (correct [N, steps])")
    _add_no_progress(s)
    _add_seed(s, "seed of the demo target (with --target demo)")
    _add_profile_out(s)

    s = ds.add_parser("online", help="a running server's accept length and per-step acceptance vs the offline replay",
                      description="Sends the prompts as token ids to a running SGLang server's /generate (greedy, "
                                  "ignore_eos, max_new_tokens N), or reads recorded responses, checks the outputs "
                                  "equal the target's greedy continuation, replays SGLang's speculative loop offline "
                                  "for the server's flags, and compares per prompt and in total: the served accept "
                                  "length and the per-step acceptance. The target side is --target (a transformers "
                                  "model run here) or, without it, the server itself (--dump: its teacher-forced pass "
                                  "and residual stream; only the draft is loaded here, and the served slots are "
                                  "fingerprinted too). Exit 0 when they match, 1 on a mismatch (with what it means), "
                                  "2 on bad input or an unreachable server.")
    s.add_argument("--server", required=True, metavar="URL|FILE.jsonl", type=at.server,
                   help="http://host:port of a running server, or a JSONL file of recorded responses "
                        "({\"input_ids\", \"output_ids\", \"meta_info\"} a line)")
    s.add_argument("--prompts", required=True, metavar="FILE", help="as for dump-reference")
    s.add_argument("--target", metavar="PATH|demo",
                   help="the served target as a transformers directory, run here; leave it out to take the target "
                        "side from the server itself (--dump)")
    s.add_argument("--dump", metavar="DIR",
                   help="without --target: the directory the server was started with in EAGLE3_CAPTURE_DUMP. The "
                        "doctor sends each prompt + the server's continuation once more as one teacher-forced "
                        "prefill (rid eagle3-doctor-..., with input logprobs for the target's greedy token at every "
                        "position) and reads the plugin's dump of that forward: the residual stream at the layers the "
                        "draft declares, which the prediction uses (never the slots the server fed its draft: those "
                        "are fingerprinted). The doctor reads the files itself, so the server must write them where "
                        "this machine sees them (a shared filesystem). With a recorded --server file: a dump of such "
                        "a run")
    s.add_argument("--draft", required=True, metavar="PATH", help="the EAGLE-3 draft directory the server runs")
    _add_target_checkpoint(s)
    _add_server_args(s, SERVER_ARGS_HELP + "; optional with a URL (the server's /server_info says), needed with a file")
    s.add_argument("--new-tokens", type=at.int_at_least(2), default=None,
                   help="max_new_tokens per request (needed with a URL; a file's completion tokens otherwise)")
    s.add_argument("--taps", metavar="CONV:IDS", help="replay with these taps instead of the draft's declared ones")
    s.add_argument("--tolerance", type=at.finite_float(0.0, 1.0, high_open=True), default=0.02,
                   help="largest per-step acceptance difference (and relative accept-length difference) still called "
                        "a match (default 0.02)")
    s.add_argument("--timeout", type=at.finite_float(0.0, MAX_TIMEOUT_S, low_open=True), default=600.0,
                   help=f"seconds to wait for each response (default 600, at most {MAX_TIMEOUT_S:g})")
    s.add_argument("--concurrency", type=at.POSITIVE, default=8, help="requests in flight at once (default 8)")
    s.add_argument("--batch-size", type=at.POSITIVE, default=8, help="prompts per offline batch")
    _add_device_threads(s)
    _add_dtype(s)
    _add_json(s, "write the report as JSON")
    _add_no_progress(s)
    _add_seed(s, "seed of the demo target (with --target demo)")
    _add_profile_out(s)

    s = ds.add_parser("demo", help="the whole story on a tiny built-in DeepseekV3 target and a draft it trains",
                      description="Builds a tiny DeepseekV3 target (seeded, from a config in the package), trains a "
                                  "tiny EAGLE-3 draft on the target's greedy continuations with taps [Embedding, "
                                  "LayerOutput(a), LayerOutput(b)], measures offline accuracy with the correct capture "
                                  "and a miswired one (no embedding, shifted layers), runs check and fingerprint on "
                                  "the miswired one, prints a report and writes a PNG.")
    s.add_argument("--out", default="eagle3-demo", metavar="DIR", type=at.output_dir,
                   help="output directory (default ./eagle3-demo)")
    s.add_argument("--fast", action="store_true", help="smaller data and training (the test's path, ~1/3 the time)")
    _add_device_threads(s, threads_default=1,
                        threads_help="CPU threads (default 1: these tiny models are fastest on one, and the result is "
                                     "then the same on every machine count)")
    _add_seed(s)
    s.add_argument("--no-plot", action="store_true", help="skip the PNG")
    _add_no_progress(s)

    s = ds.add_parser("watch", help="a running server's per-position acceptance, live, from its /metrics",
                      description="Reads the plugin's metrics from a running server's /metrics (SGLang with "
                                  "--enable-metrics) every --interval seconds and shows, per draft position, the "
                                  "acceptance over the last interval and since the start against the expected "
                                  "profile, the server's drift statistic and alarm, verifies per second, the accept "
                                  "length and the capture self-test. With --profile the drift monitor also runs here, "
                                  "one block per interval. Each reading is judged whole (complete within its "
                                  "deadline of min(10, max(2, interval)) s and its Content-Length, every expected "
                                  "series, consistent counters) before any figure is taken from it. Exit codes: 0 "
                                  "every reading judged and no alarm; 1 an alarm was seen (the server's, a broken "
                                  "capture, or the monitor's); 3 no alarm seen but some reading could not be judged "
                                  "(failed: unreachable, partial, contradictory); 2 bad input, or the first reading "
                                  "failed.")
    s.add_argument("--server", required=True, metavar="URL", type=at.url,
                   help="http://host:port of the running SGLang server")
    s.add_argument("--profile", metavar="PROFILE.json",
                   help="the expected-acceptance profile (doctor accept|online --profile-out); default: the "
                        "server's own (its expected-acceptance gauges), if it serves one")
    s.add_argument("--interval", type=at.finite_float(0.1, 3600.0), default=5.0, metavar="S",
                   help="seconds between refreshes (default 5; 0.1 .. 3600)")
    s.add_argument("--count", type=at.POSITIVE, default=None, metavar="N",
                   help="refreshes after the first reading, then exit (default: until Ctrl-C)")
    s.add_argument("--plot", metavar="OUT.png", type=at.png_file,
                   help="a PNG of live acceptance per interval against the expected lines, alarms marked; rewritten "
                        "at every refresh")
    _add_json(s, "write the series (every refresh) as JSON at exit")
    _add_no_progress(s, "no status line on stderr")
    for p in ds.choices.values():
        one_line_errors(p)


def bad_input(e: BaseException) -> bool:
    """Whether ``e`` says the input is bad: a DoctorError, an OSError (an output that cannot be written, a file
    vanishing under us), or a DumpError. That one is looked up only once the dump format is imported (it imports
    torch, which ``doctor check`` runs without); until then none can have been raised."""
    if isinstance(e, (DoctorError, OSError)):
        return True
    contract = sys.modules.get(__package__.rpartition(".")[0] + ".dump_format.contract")
    return contract is not None and isinstance(e, contract.DumpError)


def run(args) -> int:
    """Run a parsed doctor command: a bad input (:func:`bad_input`) -> one line on stderr, exit 2."""
    try:
        return run_command(args)
    except Exception as e:
        if not bad_input(e):
            raise
        if isinstance(e, DeploymentFinding):  # the input was right: what it found is about the deployment
            print(f"eagle3-capture doctor {args.doctor_command}: finding: {e}")
            return EXIT_FINDINGS
        # one line, whatever the message holds (a value quoted from a file may have had line breaks)
        message = " ".join(str(e).split())
        print(f"eagle3-capture doctor {args.doctor_command}: error: {message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


__all__ = ["add_doctor_parser", "one_line_errors", "command_module", "run_command", "bad_input", "run"]
