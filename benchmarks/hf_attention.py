"""A small Hugging Face model at long context, forward on the CPU, with each attention backend:
attn_implementation="attnlab" against "eager" (with output_attentions=True: the only other
backend that returns attentions) and against "sdpa" (without attentions), same process.

Speed: median of alternating rounds after a warm-up (benchmarks/common.compare); ratio = the
other backend's time / attnlab's (> 1: attnlab is faster).

Peak memory: each variant in a fresh process (the model rebuilt from the same seed), run once
to warm up and freed, then the kernel's peak-RSS counter (VmHWM) is reset through
/proc/self/clear_refs and one more forward is run; the figure is the growth of the peak over
the RSS before that forward: every byte touched, kernel scratch included, the returned
attentions too. glibc is told to serve every block of 64 KiB or more with mmap
(MALLOC_MMAP_THRESHOLD_), so a freed block goes back to the system at once instead of staying
in the heap, where a later run would reuse it without the peak showing it.

    python benchmarks/hf_attention.py [--model llama|gpt2|bert] [--length 2048] [--layers 4]
        [--hidden 256] [--heads 4] [--kv-heads N] [--batch 1] [--threads 1,2] [--min-run-time 2.0]
"""

import argparse
import json
import os
import subprocess
import sys

import torch
import transformers

import attnlab
import attnlab.integrations.transformers  # noqa: F401  (registers "attnlab")
from common import compare, machine_description, markdown_table


def make_model(args, implementation):
    """The model of the command line with random weights (seed 0), in eval mode."""
    torch.manual_seed(0)
    common = dict(vocab_size=1000, num_hidden_layers=args.layers, hidden_size=args.hidden,
                  num_attention_heads=args.heads, max_position_embeddings=args.length)
    if args.model == "llama":
        config = transformers.LlamaConfig(**common, num_key_value_heads=args.kv_heads or args.heads,
                                          intermediate_size=4 * args.hidden)
    elif args.model == "gpt2":
        config = transformers.GPT2Config(vocab_size=1000, n_layer=args.layers, n_embd=args.hidden,
                                         n_head=args.heads, n_positions=args.length)
    else:
        config = transformers.BertConfig(**common, intermediate_size=4 * args.hidden)
    return transformers.AutoModel.from_config(config, attn_implementation=implementation).eval()


def make_input(args):
    return torch.randint(0, 1000, (args.batch, args.length),
                         generator=torch.Generator().manual_seed(1))


VARIANTS = {  # name: (attn_implementation, output_attentions)
    "eager+attn": ("eager", True), "attnlab+attn": ("attnlab", True),
    "sdpa": ("sdpa", False), "attnlab": ("attnlab", False), "eager": ("eager", False),
}


def forward_fn(model, ids, output_attentions):
    def run():
        with torch.no_grad():
            return model(input_ids=ids, output_attentions=output_attentions)
    return run


def status_kib(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def probe_memory(args, variant):
    """Run in a child process: the peak-RSS growth (MiB) of one forward of the variant."""
    implementation, output_attentions = VARIANTS[variant]
    model, ids = make_model(args, implementation), make_input(args)
    run = forward_fn(model, ids, output_attentions)
    out = run()
    if output_attentions:
        assert len(out.attentions) == args.layers, "the backend returned no attentions"
    del out
    before = status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:  # resets VmHWM to the current RSS
        f.write("5")
    out = run()
    return (status_kib("VmHWM") - before) / 1024


def memory_table(args):
    rows = {}
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    for variant in VARIANTS:
        command = [sys.executable, __file__, *sys.argv[1:], "--probe-memory", variant]
        out = subprocess.run(command, capture_output=True, text=True, check=True, env=env)
        rows[variant] = json.loads(out.stdout.strip().splitlines()[-1])["extra_mib"]
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["llama", "gpt2", "bert"], default="llama")
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=None,
                        help="key/value heads (llama; default: as many as query heads)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--min-run-time", type=float, default=2.0,
                        help="seconds of repeated runs behind each median (default 2.0)")
    parser.add_argument("--threads", default=None,
                        help="comma-separated intra-op thread counts to time, e.g. 1,2 "
                             "(default: 1 and torch's default)")
    parser.add_argument("--skip-memory", action="store_true", help="skip the memory probes")
    parser.add_argument("--probe-memory", choices=list(VARIANTS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    default_threads = torch.get_num_threads()
    threads = ([int(n) for n in args.threads.split(",")] if args.threads
               else sorted({1, default_threads}))

    if args.probe_memory:
        torch.set_num_threads(threads[-1])
        print(json.dumps({"extra_mib": probe_memory(args, args.probe_memory)}))
        return

    print(f"Machine: {machine_description()}")
    print(f"attnlab {attnlab.__version__}, transformers {transformers.__version__}")
    shape = (f"{args.model}, {args.layers} layers, d {args.hidden}, {args.heads} heads"
             + (f" ({args.kv_heads} key/value heads)" if args.kv_heads else "")
             + f", batch {args.batch}, L {args.length}, float32 forward (no_grad)")
    print(f"Model: {shape}\n")

    ids = make_input(args)
    fns = {name: forward_fn(make_model(args, impl), ids, attn)
           for name, (impl, attn) in VARIANTS.items()}
    # the backends agree before they are timed
    outs = {name: fn() for name, fn in fns.items()}
    ref = outs["eager+attn"]
    for name, out in outs.items():
        error = (out.last_hidden_state - ref.last_hidden_state).abs().max().item()
        print(f"{name}: max |hidden - eager's| = {error:.2e}"
              + (f", attentions {len(out.attentions)} x {tuple(out.attentions[0].shape)}"
                 if out.attentions else ", no attentions"), file=sys.stderr)
    assert outs["attnlab+attn"].attentions is not None
    del outs, ref

    names = list(fns)
    rows = []
    for count in threads:
        torch.set_num_threads(count)
        times = dict(zip(names, compare([fns[n] for n in names], args.min_run_time)))
        for label, ours, theirs in (("attentions: attnlab vs eager", "attnlab+attn", "eager+attn"),
                                    ("no attentions: attnlab vs sdpa", "attnlab", "sdpa"),
                                    ("no attentions: attnlab vs eager", "attnlab", "eager")):
            rows.append([label, count, f"{times[ours] * 1e3:.1f}", f"{times[theirs] * 1e3:.1f}",
                         f"{times[theirs] / times[ours]:.2f}"])
        print(rows[-3:], file=sys.stderr, flush=True)
    print("Forward, ms (median of alternating rounds); ratio = other / attnlab\n")
    print(markdown_table(["comparison", "threads", "attnlab ms", "other ms", "ratio"], rows))

    if not args.skip_memory:
        memory = memory_table(args)
        print(f"\nPeak memory growth of one forward (MiB; {threads[-1]} threads; the returned "
              "attentions are included: layers x batch x heads x L x L x 4 bytes = "
              f"{args.layers * args.batch * args.heads * args.length ** 2 * 4 / 2 ** 20:.0f} "
              "MiB)\n")
        print(markdown_table(["variant", "attn_implementation", "output_attentions", "MiB"],
                             [[name, *VARIANTS[name], f"{memory[name]:.0f}"]
                              for name in VARIANTS]))


if __name__ == "__main__":
    main()
