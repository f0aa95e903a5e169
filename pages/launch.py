"""Launch: choose data, model, strategy and devices; every value is checked by building the
same ``RunConfig`` the trainer runs; Launch starts a background run and opens its page.

In "Compare strategies" mode the form takes several strategies instead of one: each one's config
is checked (``sweep_configs``), and Launch starts them as one sweep and opens the Sweep page.

The first time a server process draws this page it has not imported torch and timm yet (5–10 s on
a small machine): the form is drawn at once from the built-in datasets and the default models,
the import follows once the Launch button is there, and the page then redraws itself in full."""

from __future__ import annotations

import socket

import streamlit as st

from db import dashboard
from trainer_backend.contract import devices as device_info
from trainer_backend.contract.config import (AUGMENTATIONS, CPU_PROCESSES_PER_CORE,
                                    SCALE_LR_REFERENCE_BATCH, STRATEGIES, ConfigError,
                                    MAX_CHOICE_LENGTH, MAX_MODEL_ARGS_LENGTH, MAX_PATH_LENGTH, MAX_TAG_LENGTH,
                                    MAX_TAGS, RunConfig, max_cpu_processes)
from trainer_backend.contract.model_source import is_custom_model
from trainer_backend.contract.strategy_specs import find, spec, sweep_base_for
from trainer_backend.contract.fields import FIELDS
from trainer_backend.control.lifecycle import launch, launch_sweep, parse_device_counts, sweep_configs
from ui import launch_memory, memory_views, options, own_model, state
from ui import torchrun as torchrun_ui
from ui.fields import field_widget
from ui.text import escape_markdown
from ui.validation import validate_form

state.enter_through_app("pages/launch.py")

DEFAULTS = RunConfig()  # the CLI's defaults: one source for both
# What the form starts from: DEFAULTS, or this browser session's last launch, or a run loaded from its page.
START = launch_memory.form_start()
ONE_RUN, SWEEP = "One run", "Compare strategies"
DEVICE_KINDS = ["GPUs", "CPU processes"]
SWEEP_PICKED_KEY = "sweep_strategies_picked"  # the user chose the sweep's strategies: they no longer follow the devices

values: dict = {}
slots: dict = {}  # field -> the spot right under its widget where its error goes


def field_slot(name: str) -> None:
    slots[name] = st.empty()


def device_batch_caption(config) -> str:
    """What the global batch means for each device under the chosen strategy."""
    if config is None:
        return ""
    strategy = spec(config.strategy)
    if strategy.microbatched:
        return (f"Each of the {config.world_size} stages sees the whole batch of {config.batch_size}, "
                f"in {config.microbatches} microbatches of {config.batch_size // config.microbatches}.")
    if config.world_size > 1:
        return (f"Global batch: each of the {config.world_size} processes takes {config.per_device_batch} "
                "images per step.")
    if strategy.scatters_batch and config.uses_cuda:
        return f"DataParallel splits each batch: about {config.per_device_batch} images per GPU."
    if strategy.staged:
        return f"Every stage sees the whole batch of {config.batch_size} images, one stage after the other."
    return f"One device takes all {config.batch_size} images per step."


def batch_caption(config) -> str:
    """What the global batch means for each device, and the effective batch where batches accumulate."""
    text = device_batch_caption(config)
    if config is not None and config.accumulate_steps > 1:
        text += f" Effective batch {config.effective_batch} ({config.accumulate_steps} accumulation steps)."
    return text


def recipe_caption(config) -> str:
    """The batch behind each optimizer step and the learning rate the schedule peaks at."""
    if config is None:
        return ""
    batch = (f"Each optimizer step sees {config.accumulate_steps} batches of {config.batch_size}: an effective "
             f"batch of {config.effective_batch}." if config.accumulate_steps > 1
             else f"Each optimizer step sees one batch of {config.batch_size}.")
    lr = (f"Peak learning rate {config.lr:g} × {config.effective_batch}/{SCALE_LR_REFERENCE_BATCH} = "
          f"{config.base_lr:g}." if config.scale_lr else f"Peak learning rate {config.lr:g}.")
    return f"{batch} {lr}"


def gpu_label(gpu: device_info.GpuStatus) -> str:
    return f"cuda:{gpu.index} · {gpu.name} · {gpu.memory_total_mb / 1024:.0f} GB"


@st.fragment(run_every=3)
def gpu_load_table() -> None:
    """Live NVML readings, refreshed on their own without rerunning the form."""
    st.dataframe(
        [{"GPU": f"cuda:{g.index}", "name": g.name,
          "memory used (GB)": round(g.memory_used_mb / 1024, 1), "memory (GB)": round(g.memory_total_mb / 1024, 1),
          "utilisation (%)": g.utilization_pct} for g in device_info.gpu_statuses()],
        hide_index=True,
    )


def choose_devices(strategy: str) -> tuple[str, ...]:
    known = find(strategy)  # None for "sweep": several strategies on the same devices
    one_device = known is not None and known.one_device
    one_process_staged = known is not None and known.staged and not known.distributed
    gpus = device_info.gpu_statuses()
    kind = "GPUs"
    if gpus:
        kind = st.radio("Train on", DEVICE_KINDS, horizontal=True, key="device_kind", index=start_kind())
    if gpus and kind == "GPUs":
        # One key per strategy, so switching strategy brings that strategy's sensible default.
        started = [int(d.split(":")[1]) for d in START.config.devices if d.startswith("cuda:")]
        started = [i for i in started if i < len(gpus)][:1 if one_device else None]
        default = started or ([gpus[0].index] if one_device else [g.index for g in gpus])
        picked = st.multiselect("GPUs", [g.index for g in gpus], default=default, key=f"gpus_{strategy}",
                                format_func=lambda i: gpu_label(gpus[i]))
        gpu_load_table()
        return tuple(f"cuda:{i}" for i in picked)
    cores = device_info.cpu_cores()
    if one_device:
        st.caption(f"One CPU process, using all {cores} cores.")
        return ("cpu",)
    label = ("CPU devices (processes or model stages)" if known is None else "CPU model stages (one process)"
             if one_process_staged else "CPU devices" if known.scatters_batch else "CPU worker processes")
    try:
        most = max_cpu_processes()
    except ConfigError as exc:  # PARALLAX_MAX_CPU_PROCESSES is not a number: say so, offer the default
        st.error(escape_markdown(exc), icon=":material/error:")
        most = None
    processes = st.number_input(
        label, value=start_processes(most), step=1, min_value=1, max_value=most, key=f"cpu_processes_{strategy}",
        help="Each CPU device is one process for ddp, fsdp and pp, and one model stage for mp and pp"
        + (f"; at most {most} on this machine ({CPU_PROCESSES_PER_CORE} per core)." if most else "."))
    if not isinstance(processes, int) or processes < 1:
        return ()
    if known is not None and known.scatters_batch:
        st.info("DataParallel on CPU is a pass-through: one process trains with all CPU threads, exactly like "
                "single. Pick GPUs to see DataParallel split the batch.", icon=":material/info:")
    elif known is None:
        st.caption(f"single trains in one process; the other strategies use all {processes} CPU devices "
                   f"({cores} cores shared).")
    elif one_process_staged:
        st.caption("The model is cut into one stage per device, all in one process; on a CPU this shows the "
                   "mechanics, not a speed-up.")
    else:
        threads = max(1, cores // processes)
        st.caption(f"{processes} processes share {cores} CPU cores ({threads} thread(s) each) and talk over gloo.")
    return ("cpu",) * processes


def start_kind() -> int:
    """GPUs where the machine has them, unless the form starts from a config on CPU processes."""
    return 1 if launch_memory.START_KEY in st.session_state and not START.config.uses_cuda else 0


def start_processes(most: int | None) -> int:
    """The CPU processes the form starts with: the started config's on CPU with two or more, else 2."""
    count = len(START.config.devices) if not START.config.uses_cuda and len(START.config.devices) > 1 else 2
    return min(count, most) if most else count


def sweep_device_count() -> int:
    """How many devices the sweep's device picker holds now (it is drawn after the strategies): read
    from its state, or what it will start with."""
    gpus = device_info.gpu_statuses()
    if gpus and st.session_state.get("device_kind", DEVICE_KINDS[start_kind()]) == "GPUs":
        return len(st.session_state.get("gpus_sweep", [g.index for g in gpus]))
    processes = st.session_state.get("cpu_processes_sweep", start_processes(None))
    return processes if isinstance(processes, int) else 0


def sweep_most_devices() -> int:
    """The most devices any run of the sweep will have: the device picker's, or a larger count to sweep."""
    try:
        counts = parse_device_counts(st.session_state.get("sweep_device_counts", START.device_counts).strip() or None)
    except ValueError:  # said under the field
        counts = None
    return max([sweep_device_count(), *(counts or ())])


def start_sweep_strategies() -> None:
    """Until the user picks the sweep's strategies, they are those the chosen devices allow (or the
    remembered sweep's, where the form starts from one); a choice of theirs is kept."""
    if "sweep_strategies" in st.session_state and st.session_state.get(SWEEP_PICKED_KEY):
        return
    if START.sweep_strategies is not None and "sweep_strategies" not in st.session_state:
        st.session_state["sweep_strategies"] = list(START.sweep_strategies)
        st.session_state[SWEEP_PICKED_KEY] = True
        return
    st.session_state["sweep_strategies"] = launch_memory.strategies_allowed(sweep_most_devices())
    st.session_state[SWEEP_PICKED_KEY] = False


def mark_sweep_picked() -> None:
    st.session_state[SWEEP_PICKED_KEY] = True


def sweep_errors(config, strategies: list[str], device_counts: tuple[int, ...] | None = None) -> dict[str, str]:
    """Each strategy's own config checked as the sweep will build it; errors name the strategy."""
    errors: dict[str, str] = {}
    for strategy in strategies:
        try:
            sweep_configs(config, [strategy], device_counts)
        except ConfigError as exc:
            errors.setdefault(exc.field, f"With {strategy}: {exc}")
    return errors


st.title("Launch a run")
st.caption(f"The defaults train {DEFAULTS.model} on the bundled handwritten digits for {DEFAULTS.epochs} epochs in "
           "one CPU process: a quick run that works on any machine. Every value is checked as you change it.")
if START.said:
    st.info(START.said, icon=":material/content_copy:")
mode = st.radio("What to launch", [ONE_RUN, SWEEP], horizontal=True, key="launch_mode", index=int(START.sweeping),
                captions=["one strategy", "a sweep: the same training under several strategies, with a scaling report"])
sweeping = mode == SWEEP
full = options.training_stack_loaded()  # else a quick first draw, with what needs neither torch nor timm

data_col, model_col = st.columns(2, gap="large")
with data_col:
    st.subheader("Data")
    roots = ", ".join(str(p) for p in options.data_roots())
    datasets = options.dataset_choices()
    values["dataset"] = st.selectbox(
        "Dataset", datasets, format_func=options.dataset_label, key="dataset",
        index=launch_memory.index_of(datasets, START.config.dataset),
        help=f"{FIELDS['dataset'].help} Offered: the built-in sets, and every sub-folder (one folder per class "
        f"inside, or train/ and val/) and .csv/.txt list file of: {roots} (set PARALLAX_DATA_ROOTS, colon-separated, "
        "to look elsewhere).")
    outside = options.outside_roots(values["dataset"])  # never read a folder outside the roots
    if outside:
        info = {"problems": [outside], "warnings": []}
    else:
        info = options.describe_dataset(values["dataset"]) if full else {"problems": [], "warnings": []}
    st.caption(options.dataset_summary(info) if full or outside else "Reading the dataset…")
    for warning in info.get("warnings", []):
        st.caption(f":orange[:material/warning: {escape_markdown(warning)}]")
    field_slot("dataset")
    values["image_size"] = field_widget(FIELDS["image_size"], START.config.image_size)
    field_slot("image_size")

with model_col:
    st.subheader("Model")
    started_own = is_custom_model(START.config.model)
    own = st.radio("Model from", [own_model.TIMM, own_model.OWN], horizontal=True, key="model_kind",
                   index=int(started_own), captions=["a timm architecture", "path/to/file.py:Attr or pkg.module:Attr"]
                   ) == own_model.OWN
    if own:
        values["model"] = st.text_input(
            "Your model", key="own_model", value=START.config.model if started_own else "",
            placeholder="~/nets/mynet.py:Net", max_chars=MAX_PATH_LENGTH,
            help="An nn.Module class or a function returning one, in a .py file or an importable module. It is "
            "checked in a separate process (imported, built on the meta device, one fake forward at the image "
            "size); the dashboard never imports it.").strip()
        field_slot("model")
        values["model_args"] = field_widget(FIELDS["model_args"], START.config.model_args if started_own else "{}",
                                            max_chars=MAX_MODEL_ARGS_LENGTH)
        field_slot("model_args")
        verdict_slot = st.empty()
        model_problem = None  # the child's verdict, once the config builds
    else:
        models = options.model_choices() if full else list(options.DEFAULT_MODELS)
        values["model"] = st.selectbox(FIELDS["model"].label, models, key="model", help=FIELDS["model"].help,
                                       index=launch_memory.index_of(models, START.config.model))
        field_slot("model")
        # The defaults are timm models (a test checks it): the quick first draw need not ask timm.
        model_problem = options.model_problem(values["model"]) if full else None
    count_slot = st.empty()  # filled once the button is there: a large model takes a while to count

strategy_col, devices_col = st.columns(2, gap="large")
with strategy_col:
    names = list(STRATEGIES)
    if sweeping:
        st.subheader("Strategies")
        start_sweep_strategies()
        sweep_strategies = st.multiselect("Strategies to compare", names, key="sweep_strategies",
                                          on_change=mark_sweep_picked, placeholder="Pick two or more strategies")
        st.caption(" · ".join(f"**{n}**: {STRATEGIES[n]}" for n in sweep_strategies))
        field_slot("strategy")
    else:
        st.subheader("Strategy")
        values["strategy"] = st.radio("Strategy", names, captions=[STRATEGIES[n] for n in names], key="strategy",
                                      label_visibility="collapsed",
                                      index=launch_memory.index_of(names, START.config.strategy))
        field_slot("strategy")
    if any(spec(name).microbatched for name in (sweep_strategies if sweeping else [values["strategy"]])):
        values["microbatches"] = field_widget(FIELDS["microbatches"], START.config.microbatches)
        field_slot("microbatches")
        values["pipeline_schedule"] = field_widget(FIELDS["pipeline_schedule"], START.config.pipeline_schedule)
        field_slot("pipeline_schedule")
with devices_col:
    st.subheader("Devices")
    values["devices"] = choose_devices("sweep" if sweeping else values["strategy"])
    field_slot("devices")
    memory_slot = st.container()  # the memory estimate, filled in once the rest of the page is drawn
    if sweeping:
        counts_text = st.text_input(
            "Device counts to sweep (optional, e.g. 1,2,4)", key="sweep_device_counts", max_chars=200,
            value=START.device_counts,
            help="Each multi-device strategy runs once per count (on CPU: that many processes), and the report "
            "forecasts 2× and 4× the devices; single runs once, on one device. Blank: the devices above.")
        field_slot("device_counts")
if sweeping:
    # Every strategy's estimate, side by side: the whole width (in the Devices column it was cut at 1,400 px).
    memory_slot = st.container()
    # The shared fields are checked under a strategy that takes any number of devices; the
    # strategies' own rules are then checked one by one, as the sweep will build them.
    values["strategy"] = sweep_base_for(len(values["devices"])).name

st.subheader("Training")
# Three to a row: an error under a field needs room to be read.
batch_col, epochs_col, lr_col = st.columns(3)
with batch_col:
    values["batch_size"] = field_widget(FIELDS["batch_size"], START.config.batch_size)
    batch_hint = st.empty()
    field_slot("batch_size")
with epochs_col:
    values["epochs"] = field_widget(FIELDS["epochs"], START.config.epochs)
    field_slot("epochs")
with lr_col:
    values["lr"] = field_widget(FIELDS["lr"], START.config.lr)
    field_slot("lr")
optimizer_col, amp_col, profile_col = st.columns(3, vertical_alignment="bottom")
with optimizer_col:
    values["optimizer"] = field_widget(FIELDS["optimizer"], START.config.optimizer)
    field_slot("optimizer")
with amp_col:
    values["amp"] = field_widget(FIELDS["amp"], START.config.amp)
    field_slot("amp")
with profile_col:
    values["profile"] = field_widget(FIELDS["profile"], START.config.profile, toggle=True)
    field_slot("profile")

with st.expander("More options"):
    more_left, more_right = st.columns(2)
    with more_left:
        values["pretrained"] = field_widget(FIELDS["pretrained"], START.config.pretrained)
        field_slot("pretrained")
        values["weight_decay"] = field_widget(FIELDS["weight_decay"], START.config.weight_decay)
        field_slot("weight_decay")
        values["val_from"] = field_widget(FIELDS["val_from"], START.config.val_from)
        field_slot("val_from")
        values["val_fraction"] = field_widget(FIELDS["val_fraction"], START.config.val_fraction)
        field_slot("val_fraction")
        values["stored_size"] = field_widget(FIELDS["stored_size"], START.config.stored_size)
        field_slot("stored_size")
        values["decode"] = field_widget(FIELDS["decode"], START.config.decode)
        field_slot("decode")
        values["data_on_device"] = field_widget(FIELDS["data_on_device"], DEFAULTS.data_on_device)
        field_slot("data_on_device")
    with more_right:
        values["seed"] = field_widget(FIELDS["seed"], START.config.seed)
        field_slot("seed")
        values["num_workers"] = field_widget(FIELDS["num_workers"], START.config.num_workers)
        field_slot("num_workers")
        values["bn_stats_images"] = field_widget(FIELDS["bn_stats_images"], START.config.bn_stats_images)
        field_slot("bn_stats_images")
        bands_text = field_widget(FIELDS["bands"], ",".join(map(str, START.config.bands or ())),
                                  max_chars=MAX_CHOICE_LENGTH)
        values["bands"] = bands_text.strip() or None
        field_slot("bands")

with st.expander("Advanced"):
    st.markdown("**Training recipe**")
    schedule_col, warmup_col, scale_col = st.columns(3, vertical_alignment="bottom")
    with schedule_col:
        values["lr_schedule"] = field_widget(FIELDS["lr_schedule"], START.config.lr_schedule)
        field_slot("lr_schedule")
    with warmup_col:
        values["warmup_epochs"] = field_widget(FIELDS["warmup_epochs"], START.config.warmup_epochs)
        field_slot("warmup_epochs")
    with scale_col:
        values["scale_lr"] = field_widget(FIELDS["scale_lr"], START.config.scale_lr)
        field_slot("scale_lr")
    smoothing_col, clip_col, accumulate_col = st.columns(3)
    with smoothing_col:
        values["label_smoothing"] = field_widget(FIELDS["label_smoothing"], START.config.label_smoothing)
        field_slot("label_smoothing")
    with clip_col:
        values["grad_clip"] = field_widget(FIELDS["grad_clip"], START.config.grad_clip)
        field_slot("grad_clip")
    with accumulate_col:
        values["accumulate_steps"] = field_widget(FIELDS["accumulate_steps"], START.config.accumulate_steps)
        field_slot("accumulate_steps")
    nonfinite_col, stall_col, keep_col = st.columns(3)
    with nonfinite_col:
        values["on_nonfinite"] = field_widget(FIELDS["on_nonfinite"], DEFAULTS.on_nonfinite)
        field_slot("on_nonfinite")
    with stall_col:
        values["on_stall"] = field_widget(FIELDS["on_stall"], DEFAULTS.on_stall)
        field_slot("on_stall")
    with keep_col:
        values["keep_checkpoints"] = field_widget(FIELDS["keep_checkpoints"], DEFAULTS.keep_checkpoints)
        field_slot("keep_checkpoints")
    recipe_hint = st.empty()
    st.markdown("**Augmentation and speed**")
    augment_col, speed_col = st.columns(2)
    with augment_col:
        augment = st.multiselect(FIELDS["augment"].label, AUGMENTATIONS, key="augment", help=FIELDS["augment"].help,
                                 default=[a for a in START.config.augment.split(",") if a in AUGMENTATIONS])
        values["augment"] = ",".join(augment) or "none"
        field_slot("augment")
    with speed_col:
        values["channels_last"] = field_widget(FIELDS["channels_last"], START.config.channels_last)
        field_slot("channels_last")
        values["compile"] = field_widget(FIELDS["compile"], START.config.compile)
        field_slot("compile")

st.subheader("Labels")
tags_col, note_col = st.columns([1, 2])
with tags_col:
    tags_text = field_widget(FIELDS["tags"], ", ".join(START.config.tags), placeholder="baseline, fp32",
                             max_chars=MAX_TAGS * (MAX_TAG_LENGTH + 2))
    values["tags"] = tuple(t.strip() for t in tags_text.split(",") if t.strip())
    field_slot("tags")
with note_col:
    user_note = st.text_area("Note", key="note", height=68, placeholder="What is this run meant to show?")

config, errors = validate_form(values)
device_counts = None
if sweeping:
    try:
        device_counts = parse_device_counts(counts_text.strip() or None)
    except ValueError as exc:
        errors["device_counts"] = str(exc)
    if config is not None and "device_counts" not in errors:
        errors = sweep_errors(config, sweep_strategies, device_counts)
    if len(sweep_strategies) < 2:
        errors.setdefault("strategy", "Pick at least two strategies to compare.")
if model_problem:
    errors["model"] = model_problem
if own and config is not None and not errors.keys() & {"model", "model_args"}:
    with verdict_slot, st.spinner("Checking your model in a separate process…"):
        verdict = own_model.model_verdict(own_model.config_to_check(config, sweep_strategies if sweeping else None))
    if verdict.ok:
        verdict_slot.success(f"{escape_markdown(verdict.line)} (checked in {verdict.seconds:.1f} s)",
                             icon=":material/check_circle:")
    else:
        errors["model"] = verdict.line
if info.get("problems"):
    errors["dataset"] = "; ".join(info["problems"])
elif full and (memory := options.memory_problem(info, values["stored_size"] or values["image_size"],
                                                config.bands if config else None)):
    errors["dataset"] = memory
if full and config is not None and (kept := options.data_on_device_problem(config)):
    errors["data_on_device"] = kept
batch_hint.caption("" if sweeping else batch_caption(config))
recipe_hint.caption(recipe_caption(config))
general = st.empty()
for name, message in errors.items():
    slots.get(name, general).error(escape_markdown(message), icon=":material/error:")

if sweeping:
    planned = len(sweep_strategies)
    if config is not None and not errors:
        planned = len(sweep_configs(config, sweep_strategies, device_counts))
    if st.button(f"Launch the sweep ({planned} runs)", type="primary", icon=":material/rocket_launch:",
                 disabled=bool(errors), help="They queue and run one after another (one CPU run at a time)."):
        try:
            sweep_id, run_ids = launch_sweep(config, sweep_strategies, data_roots=options.data_roots(),
                                             device_counts=device_counts)
            for run_id in run_ids if user_note.strip() else []:
                dashboard.set_user_note(state.engine(), run_id, user_note)
        except Exception as exc:  # a launch that cannot start (disk full, database locked) must say why
            st.error(f"The sweep could not be started: {escape_markdown(exc)}")
        else:
            launch_memory.remember(launch_memory.FormStart(
                config, sweeping=True, sweep_strategies=tuple(sweep_strategies), device_counts=counts_text))
            state.open_sweep(sweep_id)
elif st.button("Launch", type="primary", icon=":material/rocket_launch:", disabled=bool(errors)):
    try:
        run_id = launch(config, data_roots=options.data_roots())
        if user_note.strip():
            dashboard.set_user_note(state.engine(), run_id, user_note)
    except Exception as exc:  # a launch that cannot start (disk full, database locked) must say why
        st.error(f"The run could not be started: {escape_markdown(exc)}")
    else:
        launch_memory.remember(launch_memory.FormStart(config))
        state.open_run(run_id)
if errors:
    st.caption("Fix the values marked in red to launch.")

if not full:
    count_slot.caption("Counting parameters…")
    options.load_training_stack()  # the form is usable meanwhile; a click waits for the import to end
    st.rerun()  # every model, the dataset's details, the parameter count and their checks
if own:
    count_slot.caption("Parameter count and memory estimate: not computed here, since that would import your "
                       "code into the dashboard; `python -m trainer_backend estimate --model ...` gives them.")
elif model_problem is None:
    num_classes = int(info.get("num_classes") or 10)
    count = options.parameter_count(values["model"], num_classes, options.input_channels(info, None))
    count_slot.caption(f"{options.format_count(count)} parameters for {num_classes} classes" if count else
                       "Parameter count unavailable for this architecture.")

if not sweeping and spec(values["strategy"]).distributed and config is not None:
    with st.expander("Run across machines with torchrun"):
        st.caption("Run the same command on every machine. torchrun starts nodes × processes per node processes, "
                   "one device each (cuda:LOCAL_RANK, or the CPU): the world comes from torchrun, the devices above "
                   "only say which kind. Every machine needs the dataset and the same database: set PARALLAX_DB_URL "
                   "to one they all reach, since rank 0 records the run on whichever machine torchrun gives it. "
                   "With restarts, a failed job starts again and resumes its run from the last finished epoch.")
        nodes_col, procs_col, restarts_col = st.columns(3)
        nodes = nodes_col.number_input("Nodes (machines)", value=2, step=1, key="torchrun_nodes")
        procs = procs_col.number_input("Processes per node", value=len(config.devices), step=1, key="torchrun_procs")
        restarts = restarts_col.number_input("Restarts on failure", value=0, step=1, key="torchrun_restarts")
        endpoint_col, job_col = st.columns(2)
        endpoint = endpoint_col.text_input("Rendezvous endpoint (HOST:PORT on one of the machines)",
                                           value=f"{socket.gethostname()}:29400", key="torchrun_endpoint",
                                           max_chars=300)
        st.session_state.setdefault("torchrun_job_id", torchrun_ui.new_job_id())  # one per session, not per rerun
        job_id = job_col.text_input("Job id (unique per job)", key="torchrun_job_id", max_chars=128)
        try:
            st.code(torchrun_ui.torchrun_command(config, nodes=nodes, procs_per_node=procs, endpoint=endpoint,
                                                 job_id=job_id, max_restarts=restarts), language="bash")
        except ConfigError as exc:
            st.error(str(exc), icon=":material/error:")

# Last, so that every field and the Launch button are drawn before the estimate runs (cached per config).
if full and config is not None and not errors and not own:
    with memory_slot:
        num_classes, in_chans = int(info.get("num_classes") or 10), options.input_channels(info, config.bands)
        if sweeping:
            memory_views.compare_table(sweep_configs(config, sweep_strategies, device_counts), num_classes, in_chans)
        else:
            memory_views.memory_panel(config, num_classes, in_chans)
