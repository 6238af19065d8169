"""Command line: ``python -m attnlab <command>``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

from . import build_info, cmake_prefix_path
from .functional import scaled_dot_product_attention


def run_demo(args: argparse.Namespace) -> int:
    """Prints attention outputs and weights of three small examples."""
    torch.manual_seed(args.seed)
    torch.set_printoptions(precision=4, sci_mode=False)
    info = build_info()
    print(f"attnlab {info['version']} (torch {info['torch']}, CUDA kernels: {info['cuda']})\n")

    print(f"1. Random query, key and value: sequence length {args.length}, {args.dim} features")
    q, k, v = (torch.randn(args.length, args.dim) for _ in range(3))
    output, weights = scaled_dot_product_attention(q, k, v, need_weights=True)
    print("query\n", q, "\nkey\n", k, "\nvalue\n", v, sep="")
    print("weights = softmax(q kᵀ / sqrt(d)), each row sums to 1\n", weights, sep="")
    print("output = weights @ value\n", output, "\n", sep="")

    print("2. Key-value lookup: keys are 10 × rows of the identity, the last two equal")
    keys = 10 * torch.eye(4)
    keys[3] = keys[2]
    values = torch.arange(16.0).reshape(4, 4)
    queries = torch.stack([keys[0], keys[2]])
    output, weights = scaled_dot_product_attention(queries, keys, values, scale=1.0,
                                                   need_weights=True)
    print("values\n", values, sep="")
    print("query = key 0 picks value 0; query = key 2 matches keys 2 and 3 and averages them")
    print("weights\n", weights, "\noutput\n", output, "\n", sep="")

    print("3. Causal mask: query i sees keys 0..i")
    _, weights = scaled_dot_product_attention(q, k, v, is_causal=True, need_weights=True)
    print(weights)
    return 0


def run_experiment(args: argparse.Namespace) -> int:
    """Trains one experiment on ``args.device``, prints its metrics, writes results.json and
    PNG plots; with ``--seeds``, once per seed (in ``OUT/seed-N``) and then ``OUT/summary.json``
    with the mean ± std over the seeds. Under torchrun every process trains its share and
    process 0 alone prints and writes."""
    from .train import process_group
    with process_group(args.device) as (rank, world_size):
        if args.seeds is None:
            _run_experiment(args, rank, world_size)
            return 0
        seeds = seed_list(args.seeds, args.seed)
        base = None if args.out is None else Path(args.out)
        summaries = []
        for seed in seeds:
            one = argparse.Namespace(**{**vars(args), "seed": seed, "seeds": None,
                                        "out": None if base is None else str(base / f"seed-{seed}")})
            summaries.append(_run_experiment(one, rank, world_size, subfolder=f"seed-{seed}"))
        if rank != 0:
            return 0
        out = base or Path(summaries[0]["out"]).parent
        summary = seed_summary(summaries)
        write_json(out / "summary.json", summary)
        print(format_seed_summary(summary))
        print(f"per-seed results in {out}/seed-*/, the summary in {out / 'summary.json'}")
    return 0


def seed_list(seeds: str, first: int) -> list[int]:
    """The seeds ``--seeds`` asks for: a count N (N seeds from ``first``, the ``--seed``) or a
    comma-separated list of seeds ("0,1,2,3,4"). Raises ValueError naming the option."""
    text = str(seeds).strip()
    try:
        if "," in text:
            chosen = [int(part) for part in text.split(",") if part.strip()]
        else:
            count = int(text)
            if count < 1:
                raise ValueError
            chosen = list(range(first, first + count))
    except ValueError:
        raise ValueError(f"--seeds must be a count N >= 1 (N seeds from --seed) or a comma-"
                         f"separated list of seeds such as 0,1,2,3,4, got {seeds!r}") from None
    if not chosen or len(set(chosen)) != len(chosen) or min(chosen) < 0:
        raise ValueError(f"--seeds must list distinct seeds >= 0, got {seeds!r}")
    return chosen


def size_list(sizes: str) -> list[int]:
    """The training-set sizes ``--sizes`` asks for: increasing positive integers, comma-separated.
    Raises ValueError naming the option."""
    try:
        chosen = [int(part) for part in str(sizes).split(",") if part.strip()]
    except ValueError:
        chosen = []
    if not chosen or min(chosen) < 1 or chosen != sorted(set(chosen)):
        raise ValueError(f"--sizes must be increasing sample counts >= 1, comma-separated "
                         f"(such as 25,50,100), got {sizes!r}")
    return chosen


def _mean_std(values: list[float]) -> dict:
    import statistics
    return {"mean": statistics.fmean(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values), "values": values}


def seed_summary(summaries: list[dict]) -> dict:
    """What summary.json holds for the runs of one experiment over several seeds: the seeds,
    each run's folder and metrics, and for every split and metric the mean, the sample standard
    deviation (n − 1), the minimum, the maximum and the per-seed values."""
    first = summaries[0]
    splits = [split for split in ("train", "val", "test") if split in first]
    metrics = {split: {name: _mean_std([run[split][name] for run in summaries])
                       for name in first[split]} for split in splits}
    per_seed = [{"seed": run["config"]["train"]["seed"], "out": run["out"],
                 **{split: run[split] for split in splits}, "seconds": run["seconds"],
                 **({"selected_epoch": run["selected_epoch"]} if "selected_epoch" in run else {})}
                for run in summaries]
    summary = {"experiment": first["experiment"], "fast": first["fast"],
               "seeds": [run["seed"] for run in per_seed], "metrics": metrics,
               "seconds": _mean_std([run["seconds"] for run in summaries]),
               "runs": per_seed, "config": first["config"], "build": first["build"]}
    if "selected_by" in first:
        summary["selected_by"] = first["selected_by"]
    return summary


# Metrics printed as percentages.
PERCENT_METRICS = ("accuracy", "attention_zero_fraction")


def format_seed_summary(summary: dict) -> str:
    """One line per split: each metric's mean ± std over the seeds (accuracies and the fraction
    of exact zeros in the attention maps in %)."""
    def value(name, stats):
        if name in PERCENT_METRICS or name.startswith("argmax"):
            return f"{name} {100 * stats['mean']:.2f} ± {100 * stats['std']:.2f} %"
        return f"{name} {stats['mean']:.4f} ± {stats['std']:.4f}"
    seeds = summary["seeds"]
    lines = [f"{summary['experiment']}: {len(seeds)} seeds ({', '.join(map(str, seeds))}), "
             f"mean ± std (sample standard deviation)"]
    for split, metrics in summary["metrics"].items():
        lines.append(f"  {split}: " + ", ".join(value(name, stats)
                                                for name, stats in metrics.items()))
    return "\n".join(lines)


def _run_experiment(args: argparse.Namespace, rank: int, world_size: int,
                    subfolder: str | None = None) -> dict | None:
    from . import plot  # matplotlib and the experiments load only for the commands using them
    from .tasks import TASKS
    from .train import fit

    module = TASKS[args.command]
    config = (module.fast_config if args.fast else module.default_config)(args.seed)
    if args.epochs is not None:
        config.train = dataclasses.replace(config.train, epochs=args.epochs)
    own_options = {option: getattr(args, option) for option in ("data", "dataset", "weights",
                                                                "image_size", "normalizer")
                   if getattr(args, option, None) is not None}
    config = dataclasses.replace(config, **own_options)  # validated again
    # Experiments with options of their own apply them and may name their runs by them.
    config = getattr(module, "apply_options", lambda config, args: config)(config, args)
    run_name = getattr(module, "run_name", lambda config: args.command)(config)
    default_out = Path(f"runs/{run_name}{'-fast' if args.fast else ''}")
    out = Path(args.out) if args.out else default_out / (subfolder or "")
    task = module.make_task(config, device=args.device)
    result = fit(task, config.train, out_dir=out, progress=not args.quiet, device=args.device)
    if rank != 0:
        return None

    maps, tokens = module.attention_example(task)
    plot.attention_grid(maps, tokens, title=f"{args.command}: attention of a test example") \
        .savefig(out / "attention.png", dpi=120)
    from .viz import FILE_NAME, save_maps  # the maps again, for `python -m attnlab view`
    save_maps(out / FILE_NAME, maps, tokens, title=f"{run_name}: attention of a test example")
    plot.training_curves(result["history"]).savefig(out / "training.png", dpi=120)
    for name, figure in getattr(module, "extra_figures", lambda task: {})(task).items():
        figure.savefig(out / f"{name}.png", dpi=120)
    splits = [split for split in ("test", "val", "train") if split in result]
    summary = {"experiment": args.command, "fast": args.fast, "seed": args.seed, "out": str(out),
               "config": dataclasses.asdict(config),
               **{split: result[split] for split in splits}, "seconds": result["seconds"],
               **{key: result[key] for key in ("device", "world_size", "steps_per_epoch", "lr",
                                               "warmup_steps", "selected_epoch", "selected_by")
                  if key in result},
               "history": result["history"], "build": build_info()}
    write_json(out / "results.json", summary)

    def describe(split):
        return ", ".join(f"{split} {k} {100 * v:.2f} %" if k in PERCENT_METRICS
                         else f"{split} {k} {v:.4f}" for k, v in result[split].items())
    where = result["device"] + (f", {world_size} processes" if world_size > 1 else "")
    chosen = (f" (weights of epoch {result['selected_epoch']}, the {result['selected_by']})"
              if "selected_epoch" in result else "")
    print(f"{args.command} seed {args.seed}: {', '.join(map(describe, splits))}{chosen}; "
          f"{result['seconds']:.1f} s of training ({where}); results and plots in {out}/")
    return summary


def write_json(path: Path, content: dict) -> None:
    """A JSON file, written atomically (a temporary file renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(content, indent=2))
    tmp.replace(path)


def write_results(out: Path, summary: dict) -> None:
    """results.json in the folder ``out``, written atomically."""
    write_json(out / "results.json", summary)


def refuse_several_processes(command: str) -> None:
    """sparse-and and rule-and train full-batch models of a few parameters: one process."""
    from .train import world
    if world()[1] > 1:
        raise ValueError(f"{command} trains full-batch models in one process; run it without "
                         f"torchrun")


def run_sparse_and(args: argparse.Namespace) -> int:
    """The sparse-AND table of the Neuromatch attention tutorial over several seeds, with its
    plots; with ``--sample-complexity`` its Exercise 3.4 instead."""
    from . import plot
    from .tasks import sparse_and
    refuse_several_processes("sparse-and")
    make_config = sparse_and.fast_config if args.fast else sparse_and.default_config
    seeds = seed_list(args.seeds or ("2" if args.fast else "5"), args.seed)
    config = make_config(len(seeds), generator=args.generator)
    suffix = ("-plain" if args.generator == "plain" else "") + ("-fast" if args.fast else "")
    if args.sample_complexity:
        out = Path(args.out or f"runs/sample-complexity{suffix}")
        sizes = (size_list(args.sizes) if args.sizes
                 else [25, 50, 100, 200] if args.fast else list(sparse_and.SWEEP_SIZES))
        sweep = sparse_and.sample_complexity(config, sizes=sizes, seeds=seeds,
                                             sparsity=args.sparsity, progress=not args.quiet,
                                             device=args.device)
        write_results(out, {"experiment": "sparse-and --sample-complexity", "fast": args.fast,
                            **sweep, "device": str(args.device), "build": build_info()})
        plot.sample_complexity(sweep).savefig(out / "sample_complexity.png", dpi=120)
        print(sparse_and.format_sample_complexity(sweep))
        print(f"results and plot in {out}/")
        return 0
    out = Path(args.out or f"runs/sparse-and{suffix}")
    table = sparse_and.results_table(config, seeds=seeds, progress=not args.quiet,
                                     keep_runs=True, device=args.device)
    write_results(out, {"experiment": "sparse-and", "fast": args.fast,
                        **sparse_and.table_summary(table), "device": str(args.device),
                        "build": build_info()})
    for name, figure in sparse_and.table_figures(table).items():
        figure.savefig(out / f"{name}.png", dpi=120)
    seconds = sum(row["seconds"] for row in table["rows"])
    print(sparse_and.format_table(table["rows"], config.generator))
    print(f"mean ± std over seeds {', '.join(map(str, seeds))}; {seconds:.1f} s of training; "
          f"results and plots in {out}/")
    return 0


def run_rule_and(args: argparse.Namespace) -> int:
    """The SAT on the Neuromatch tutorial's rule task over seeds: its attention graph (the
    tutorial's quantity, on fresh samples) and whether each rule's targets are recovered."""
    from . import plot
    from .tasks import sparse_and
    refuse_several_processes("rule-and")
    config = sparse_and.rule_fast_config() if args.fast else sparse_and.rule_default_config()
    seeds = seed_list(args.seeds or "1", args.seed)
    out = Path(args.out or f"runs/rule-and{'-fast' if args.fast else ''}")
    runs = [sparse_and.run_rule_task(config, seed=seed, progress=not args.quiet,
                                     device=args.device) for seed in seeds]
    summary = sparse_and.rule_seeds_summary(runs, config, seeds)
    write_results(out, {"experiment": "rule-and", "fast": args.fast, **summary,
                        "device": str(args.device), "build": build_info()})
    for seed, run in zip(seeds, runs):
        name = "attention_graph" if seed == seeds[0] else f"attention_graph_seed{seed}"
        plot.attention_graph(run["edges"], run["generator"].targets, centre=True,
                             title=f"rule task, seed {seed}: Σⱼ attention[i, j]·readout[j] on "
                                   f"positive fresh samples\n(widths: departure from the "
                                   f"row's median)") \
            .savefig(out / f"{name}.png", dpi=120)
    print(sparse_and.format_rule_seeds(summary))
    print(f"{sum(run['seconds'] for run in runs):.1f} s of training; results and plots in "
          f"{out}/")
    return 0


def run_view(args: argparse.Namespace) -> int:
    """Writes the attention viewer (HTML) or a static figure (PNG, SVG, PDF) for a run."""
    from . import viz
    source = Path(args.run)
    content = viz.load_maps(source)
    folder = source if source.is_dir() else source.parent
    out = Path(args.out) if args.out else folder / "attention.html"
    options = dict(batch=args.batch, max_tokens=args.max_tokens)
    if out.suffix.lower() in (".png", ".svg", ".pdf"):
        options["batch"] = args.batch or 0  # a figure shows one example
        if args.view == "model":
            figure = viz.static.model_view_figure(content["maps"], content["tokens"],
                                                  content["key_tokens"], title=content["title"],
                                                  **options)
        else:
            figure = viz.static.head_view_figure(
                content["maps"], content["tokens"], content["key_tokens"], layer=args.layer,
                head=args.head, mode=args.mode, **options)
        figure.savefig(out, dpi=150)
    elif out.suffix.lower() in (".html", ".htm"):
        show = viz.model_view if args.view == "model" else viz.head_view
        show(content["maps"], content["tokens"], content["key_tokens"], layer=args.layer,
             head=args.head, mode=args.mode, precision=args.precision, title=content["title"],
             **options).save(out)
    else:
        raise ValueError(f"--out must end in .html, .png, .svg or .pdf, got {out.name}")
    print(f"{args.view} view of {source} written to {out} ({out.stat().st_size / 1024:.0f} KiB)")
    return 0


def add_experiment_parser(commands, name: str, help_text: str, fast_help: str):
    """The options every experiment takes."""
    parser = commands.add_parser(name, help=help_text)
    parser.add_argument("--fast", action="store_true", help=fast_help)
    parser.add_argument("--out", help=f"folder for results.json, plots and the checkpoint "
                        f"(default runs/{name}[-fast]); an existing checkpoint there is resumed")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--seeds", help="train once per seed: a count N (N seeds from --seed) or "
                        "a list such as 0,1,2,3,4; each run in OUT/seed-N, then OUT/summary.json "
                        "with the mean ± std of every metric")
    parser.add_argument("--epochs", type=int, help="number of epochs (default: the config's)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    add_device_option(parser)
    parser.set_defaults(handler=run_experiment)
    return parser


def add_normalizer_option(parser) -> None:
    """``--normalizer``, for the experiments whose attention can use a sparse normalizer."""
    from .tasks.sparsity import EXPERIMENT_NORMALIZERS
    parser.add_argument("--normalizer", choices=EXPERIMENT_NORMALIZERS,
                        help="how the attention turns scores into weights: softmax (default), "
                        "sparsemax or entmax15 (both give many weights exactly 0; the run's "
                        "default folder gets the name as a suffix)")


class PrintAndExit(argparse.Action):
    """A flag that prints ``printed()`` and exits, like ``--version``."""

    def __init__(self, option_strings, dest, printed, help=None):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)
        self.printed = printed

    def __call__(self, parser, namespace, values, option_string=None):
        print(self.printed())
        parser.exit(0)


def add_device_option(parser) -> None:
    parser.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda when a GPU is "
                        "available, else cpu; under torchrun cuda is the local rank's GPU)")


class OneLineErrorParser(argparse.ArgumentParser):
    """Usage errors as one line on stderr, exit status 2; the subcommands' parsers inherit it."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="python -m attnlab",
        description="attnlab: attention cores for PyTorch, and experiments that show the maps.")
    parser.add_argument("--version", action="version",
                        version=f"attnlab {build_info()['version']} (built against torch "
                        f"{build_info()['torch']}, CUDA kernels: {build_info()['cuda']})")
    parser.add_argument("--cmake-prefix-path", action=PrintAndExit, printed=cmake_prefix_path,
                        help="print the folder to add to CMAKE_PREFIX_PATH for "
                        "find_package(attnlab) in a C++ project, and exit")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = commands.add_parser("demo", help="print attention outputs and weights of small examples")
    demo.add_argument("--length", type=int, default=3, help="sequence length (default 3)")
    demo.add_argument("--dim", type=int, default=2, help="features per position (default 2)")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    demo.set_defaults(handler=run_demo)

    reverse = add_experiment_parser(
        commands, "reverse", "train the sequence-reversal transformer of the UvA tutorial and plot its "
        "attention", "a small configuration (about 10 s) that still reaches 99 %%")
    add_normalizer_option(reverse)
    anomaly = add_experiment_parser(
        commands, "anomaly", "train the set-anomaly transformer of the UvA tutorial on Fashion-MNIST "
        "features", "3 short epochs (about half a minute)")
    add_normalizer_option(anomaly)
    anomaly.add_argument("--dataset", choices=["fashion-mnist", "cifar100"],
                         help="fashion-mnist (default: features of a small CNN trained here) or "
                         "cifar100 (the tutorial's setting: ImageNet ResNet-34 features; needs "
                         "torchvision, --data and the weights)")
    anomaly.add_argument("--data", help="fashion-mnist: folder of the idx files (default: Debian's "
                         "dataset-fashion-mnist in /usr/share/datasets/fashion-mnist); cifar100: "
                         "the unpacked cifar-100-python folder")
    anomaly.add_argument("--weights", help="cifar100: torchvision's ResNet-34 ImageNet state_dict "
                         "(default: resnet34-b627a593.pth in the torch hub cache)")
    anomaly.add_argument("--image-size", type=int, help="cifar100: side the images are resized "
                         "to for the ResNet (default 224)")
    permutation = add_experiment_parser(
        commands, "permutation", "train the LSTM + attention model on permutation composition "
        "(the permutation-composition lab) and plot where it looks", "2 epochs of 300 fresh batches (seconds)")
    permutation.add_argument("--attention", choices=("additive", "multiplicative", "scaled"),
                             help="how queries score the objects (default scaled)")
    add_normalizer_option(permutation)
    permutation.add_argument("--position", choices=("add", "concat", "none"),
                             help="positional encoding added to the embeddings, concatenated "
                             "to them, or none (default add)")
    permutation.add_argument("--autoregressive", action="store_true", default=None,
                             help="query i may attend to positions j <= i only")
    permutation.add_argument("--readout-init", choices=("embedding", "random"),
                             help="how the output layer starts: embedding (default; its rows "
                             "are the digit embeddings, and every seed learns to look at "
                             "p2[i]) or random (PyTorch's default, under which about half the "
                             "seeds answer by looking at everything but p2[i])")
    text = add_experiment_parser(
        commands, "text", "train the sentiment classifier of the NYU self-attention notebook on an aclImdb folder",
        "2 epochs over reviews cut to 100 tokens")
    text.add_argument("--data", help="the aclImdb folder (train|test / pos|neg / *.txt); IMDB "
                      "cannot be downloaded here, so this option is needed")
    text.add_argument("--recipe", choices=("improved", "nyu"),
                      help="improved (default): learned positions, dropout 0.1, padding masked, "
                      "cosine warm-up and clipping; nyu: the notebook's own, frozen sinusoid "
                      "positions, no dropout, no padding mask, length-bucketed batches, AdamW at "
                      "a constant rate")
    sparse_and = commands.add_parser(
        "sparse-and", help="the sparse-AND table of the Neuromatch attention tutorial: a 65-parameter self-attention "
        "model and an MLP, s = 2 and 4, mean ± std over seeds")
    sparse_and.add_argument("--generator", choices=("rule-token", "plain"), default="rule-token",
                            help="rule-token (default): the generator all four of the "
                            "tutorial's runs use, 16 bits and a rule bit, keeping its last draw "
                            "when s = 4 cannot meet the label window; plain: the s-sparse AND of "
                            "the tutorial's prose, a separate table the tutorial has no figure for")
    sparse_and.add_argument("--sample-complexity", action="store_true",
                            help="the tutorial's Exercise 3.4 instead of the table: validation "
                            "accuracy against training samples for the SAT and the MLP, and the "
                            "size at which each first reaches 100 %% (per seed, mean ± std)")
    sparse_and.add_argument("--sizes", help="--sample-complexity: training-set sizes, increasing, "
                            "comma-separated (default 25,50,100,200,400,800,1600,3200; --fast "
                            "25,50,100,200)")
    sparse_and.add_argument("--sparsity", type=int, default=2,
                            help="--sample-complexity: s (default 2)")
    rule_and = commands.add_parser(
        "rule-and", help="the SAT on the sparse AND with a rule token (Neuromatch attention "
        "tutorial): the tutorial's attention graph and whether each rule's targets are "
        "recovered, over seeds")
    for parser_, handler, fast_help, seeds_help in (
            (sparse_and, run_sparse_and, "fewer epochs and 2 seeds (under a minute)",
             "seeds per row: a count N (N seeds from --seed) or a list such as 0,1,2,3,4 "
             "(default 5, --fast 2)"),
            (rule_and, run_rule_and, "half the epochs",
             "a count N (N seeds from --seed) or a list such as 0,1,2,3,4 (default 1)")):
        parser_.add_argument("--fast", action="store_true", help=fast_help)
        parser_.add_argument("--out", help="folder for results.json and the plots")
        parser_.add_argument("--seed", type=int, default=0,
                             help="random seed (default 0; the first of --seeds)")
        parser_.add_argument("--seeds", help=seeds_help)
        parser_.add_argument("--quiet", action="store_true", help="no progress bars")
        add_device_option(parser_)
        parser_.set_defaults(handler=handler)
    view = commands.add_parser(
        "view", help="write an experiment's attention maps as a self-contained HTML viewer "
        "(or as a PNG, SVG or PDF figure)")
    view.add_argument("run", metavar="RUN", help="a run folder holding attention_maps.pt "
                      "(experiments write it), or such a file")
    view.add_argument("--out", help="the file to write: .html (default RUN/attention.html), "
                      ".png, .svg or .pdf")
    view.add_argument("--view", choices=("head", "model"), default="head",
                      help="open on the head view (one layer and head) or the model view "
                      "(layers × heads); default head")
    view.add_argument("--layer", type=int, default=0, help="layer to show first (from 0)")
    def head(value):
        return value if value == "all" else int(value)

    view.add_argument("--head", type=head, default=0,
                      help="head to show first (from 0), or all (default 0)")
    view.add_argument("--batch", type=int, help="keep only this example of the batch")
    view.add_argument("--mode", choices=("auto", "lines", "heatmap"), default="auto",
                      help="lines, heat map, or auto: heat map above 256 tokens (default)")
    view.add_argument("--max-tokens", type=int, help="pool long inputs down to this many "
                      "positions")
    view.add_argument("--precision", type=int, choices=(8, 16), default=8,
                      help="bits per stored weight in the HTML (default 8)")
    view.set_defaults(handler=run_view)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if getattr(args, "length", 1) < 1 or getattr(args, "dim", 1) < 1:
        parser.error("--length and --dim must be at least 1")
    if getattr(args, "epochs", None) is not None and args.epochs < 1:
        parser.error("--epochs must be at least 1")
    try:
        if getattr(args, "seeds", None) is not None:
            seed_list(args.seeds, args.seed)
        if getattr(args, "sizes", None) is not None:
            size_list(args.sizes)
    except ValueError as error:
        parser.error(str(error))
    if getattr(args, "sparsity", 1) < 1:
        parser.error("--sparsity must be at least 1")
    from .tasks.sparse_and import GeneratorError
    from .train import CheckpointError, resolve_device
    if hasattr(args, "device"):
        try:
            args.device = resolve_device(args.device)
        except ValueError as error:
            parser.error(f"argument --device: {error}")
    try:
        return args.handler(args)
    except (ValueError, OSError, ImportError, CheckpointError, FloatingPointError,
            GeneratorError) as error:
        print(f"attnlab {args.command}: error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
