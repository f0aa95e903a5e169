"""Launch: choose data, model, strategy and devices; every value is checked by building the
same ``RunConfig`` the trainer runs; Launch starts a background run and opens its page.

The form's sections and fields come from the field catalogue (ui/field_widgets.py draws them); this page
adds the pickers whose choices come from the data roots, timm and the machine (dataset, model,
strategy, devices), and the checks and captions around them.

In "Compare strategies" mode the form takes several strategies instead of one: each one's config
is checked (``sweep_configs``), and Launch starts them as one sweep and opens the Sweep page. In "Search" mode
the form's config is the search's base, and the fields to vary, the objective and the budget follow
(ui/search_form.py); Launch records the search, starts its driver in the background and opens the Search page.

The first time a server process draws this page it has not imported torch and timm yet (5–10 s on
a small machine): the form is drawn at once from the built-in datasets and the default models,
the import follows once the Launch button is there, and the page then redraws itself in full."""

from __future__ import annotations

import socket
from collections import ChainMap
from types import SimpleNamespace

import streamlit as st

from db import dashboard
from contract import devices as device_info
from contract.config import (CPU_PROCESSES_PER_CORE,
                                    SCALE_LR_REFERENCE_BATCH, STRATEGIES, ConfigError,
                                    MAX_MODEL_ARGS_LENGTH, MAX_PATH_LENGTH, RunConfig, max_cpu_processes)
from contract.config import lr_warning as recipe_lr_warning
from contract.model_source import is_custom_model
from contract.strategy_specs import find, spec, sweep_base_for
from trainer_backend.control.lifecycle import launch, launch_sweep, parse_device_counts, sweep_configs
from trainer_backend.control.search_lifecycle import create_search, start_detached_driver
from ui import launch_memory, memory_views, options, own_model, search_form, slurm_views, state
from contract.fields import SLURM_SECTION
from ui import torchrun_command as torchrun_ui
from ui.field_widgets import draw_form, field_widget
from ui.text import escape_markdown
from ui.validation import EMPTY_OWN_MODEL, OWN_MODEL_LABEL, in_form_words, validate_form

state.enter_through_app("pages/launch.py")

DEFAULTS = RunConfig()  # the CLI's defaults: one source for both
# What the form starts from: DEFAULTS, or this browser session's last launch, or a run loaded from its page.
START = launch_memory.form_start()
ONE_RUN, SWEEP, SEARCH = "One run", "Compare strategies", "Search"
DEVICE_KINDS = ["GPUs", "CPU processes"]
SWEEP_PICKED_KEY = "sweep_strategies_picked"  # the user chose the sweep's strategies: they no longer follow the devices

values: dict = {}
slots: dict = {}  # field -> the spot right under its widget where its error goes


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
             if one_process_staged else "CPU devices" if known.scatters_batch else "CPU training processes")
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


def draw_dataset(spec, start):
    """The dataset picker: the built-ins and every folder and list file under the data roots, with what it holds."""
    roots = ", ".join(str(p) for p in options.data_roots())
    datasets = options.dataset_choices()
    chosen = st.selectbox(
        spec.label, datasets, format_func=options.dataset_label, key=spec.name,
        index=launch_memory.index_of(datasets, start),
        help=f"{spec.help} Offered: the built-in sets, and every sub-folder (one folder per class "
        f"inside, or train/ and val/) and .csv/.txt list file of: {roots} (set PARALLAX_DATA_ROOTS, colon-separated, "
        "to look elsewhere).")
    outside = options.outside_roots(chosen)  # never read a folder outside the roots
    if outside:
        page.info = {"problems": [outside], "warnings": []}
    else:
        page.info = options.describe_dataset(chosen) if full else {"problems": [], "warnings": []}
    st.caption(options.dataset_summary(page.info) if full or outside else "Reading the dataset…")
    for warning in page.info.get("warnings", []):
        st.caption(f":orange[:material/warning: {escape_markdown(warning)}]")
    return chosen


def draw_model(spec, start):
    """A timm architecture from the list, or your own model's path:Attr, checked apart (ui/own_model.py)."""
    started_own = is_custom_model(start)
    page.own = st.radio("Model from", [own_model.TIMM, own_model.OWN], horizontal=True, key="model_kind",
                        index=int(started_own),
                        captions=["a timm architecture", "path/to/file.py:Attr or pkg.module:Attr"]) == own_model.OWN
    if page.own:
        return st.text_input(
            OWN_MODEL_LABEL, key="own_model", value=start if started_own else "",
            placeholder="~/nets/mynet.py:Net", max_chars=MAX_PATH_LENGTH,
            help="An nn.Module class or a function returning one, defined in a .py file or module inside "
            f"{own_model.allowed_folders()}. It is checked in a separate process (imported, built on the meta "
            "device, one fake forward at the image size); the dashboard never imports it.").strip()
    models = options.model_choices() if full else list(options.DEFAULT_MODELS)
    chosen = st.selectbox(spec.label, models, key=spec.name, help=spec.help,
                          index=launch_memory.index_of(models, start))
    # The defaults are timm models (a test checks it): the quick first draw need not ask timm.
    page.model_problem = options.model_problem(chosen) if full else None
    return chosen


def draw_model_args(spec, start):
    """Your own model's keyword arguments; a timm model takes none from the form."""
    if not page.own:
        return spec.default
    value = field_widget(spec, start if is_custom_model(START.config.model) else spec.default,
                         max_chars=MAX_MODEL_ARGS_LENGTH)
    page.verdict_slot = st.empty()  # the child's verdict, once the config builds
    return value


def draw_strategy(spec, start):
    """One strategy, or in a sweep the strategies to compare, each with its description."""
    names = list(STRATEGIES)
    if sweeping:
        start_sweep_strategies()
        page.sweep_strategies = st.multiselect("Strategies to compare", names, key="sweep_strategies",
                                               on_change=mark_sweep_picked, placeholder="Pick two or more strategies")
        st.caption(" · ".join(f"**{n}**: {STRATEGIES[n]}" for n in page.sweep_strategies))
        shared["strategies"] = tuple(page.sweep_strategies)
        return None  # set once the devices are known: the sweep's shared fields are checked under a base strategy
    chosen = st.radio(spec.label, names, captions=[STRATEGIES[n] for n in names], key=spec.name,
                      label_visibility="collapsed", index=launch_memory.index_of(names, start))
    shared["strategies"] = (chosen,)
    return chosen


def draw_devices(spec, start):
    """The GPUs or CPU processes, the memory estimate's spot under them, and a sweep's device counts."""
    devices = choose_devices("sweep" if sweeping else values["strategy"])
    page.memory_slot = st.container()  # the memory estimate, filled in once the rest of the page is drawn
    if sweeping:
        page.counts_text = st.text_input(
            "Device counts to sweep (optional, e.g. 1,2,4)", key="sweep_device_counts", max_chars=200,
            value=START.device_counts,
            help="Each multi-device strategy runs once per count (on CPU: that many processes), and the report "
            "forecasts 2× and 4× the devices; single runs once, on one device. Blank: the devices above.")
        slots["device_counts"] = st.empty()
    return devices


def after_devices() -> None:
    if sweeping:
        # Every strategy's estimate, side by side: the whole width (in the Devices column it was cut at 1,400 px).
        page.memory_slot = st.container()
        # The shared fields are checked under a strategy that takes any number of devices; the
        # strategies' own rules are then checked one by one, as the sweep will build them.
        values["strategy"] = sweep_base_for(len(values["devices"])).name


def draw_note() -> None:
    page.user_note = st.text_area("Note", key="note", height=68, placeholder="What is this run meant to show?")


st.title("Launch a run")
st.caption(f"The defaults train {DEFAULTS.model} on the bundled handwritten digits for {DEFAULTS.epochs} epochs in "
           "one CPU process: a quick run that works on any machine. Every value is checked as you change it.")
if START.said:
    st.info(START.said, icon=":material/content_copy:")
mode = st.radio("What to launch", [ONE_RUN, SWEEP, SEARCH], horizontal=True, key="launch_mode",
                index=int(START.sweeping), captions=[
                    "one strategy", "a sweep: the same training under several strategies, with a scaling report",
                    "a search: trials over ranges of fields, the best kept (or the fastest settings that fit)"])
sweeping = mode == SWEEP
searching = mode == SEARCH
full = options.training_stack_loaded()  # else a quick first draw, with what needs neither torch nor timm

# What the page's own widgets leave for the checks below them.
page = SimpleNamespace(info={"problems": [], "warnings": []}, own=False, model_problem=None, verdict_slot=None,
                       sweep_strategies=[], counts_text="", memory_slot=None, user_note="")
shared: dict = {}  # what a field's shown_when reads besides the values: the strategies the form will run
ends = draw_form(START.config, values, slots, form=ChainMap(values, shared, START.config.to_dict()),
                 renderers={"dataset": draw_dataset, "model": draw_model, "model_args": draw_model_args,
                            "strategy": draw_strategy, "devices": draw_devices},
                 extras={"Labels": [draw_note]}, after={"Devices": after_devices})
info, own, model_problem, sweep_strategies = page.info, page.own, page.model_problem, page.sweep_strategies
verdict_slot, counts_text, memory_slot, user_note = page.verdict_slot, page.counts_text, page.memory_slot, page.user_note
count_slot = ends["Model"]  # filled once the button is there: a large model takes a while to count
batch_hint, recipe_hint = ends["Training"], ends["Training recipe"]
if values.get("where") == "slurm":  # sinfo only for a run going there: never a wait on a dead controller
    slurm_views.show_partitions(ends[SLURM_SECTION])

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
if own and not values["model"]:  # Parallax's "give a timm model name" is not what this field takes
    errors["model"] = EMPTY_OWN_MODEL
if own and config is not None and not errors.keys() & {"model", "model_args"}:
    with verdict_slot, st.spinner("Checking your model in a separate process…"):
        verdict = own_model.model_verdict(own_model.config_to_check(config, sweep_strategies if sweeping else None))
    if verdict.ok:
        verdict_slot.success(f"{escape_markdown(in_form_words(verdict.line))} (checked in {verdict.seconds:.1f} s)",
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
    slots.get(name, general).error(escape_markdown(in_form_words(message)), icon=":material/error:")
if config is not None and "lr" not in errors and (lr_warning := recipe_lr_warning(config)):
    slots["lr"].warning(escape_markdown(in_form_words(lr_warning)), icon=":material/warning:")

if searching:
    space, search_errors = search_form.search_section(None if errors else config)
    if st.button(f"Launch the search ({space.trials if space else '…'} trials)", type="primary",
                 icon=":material/rocket_launch:", disabled=bool(errors or search_errors or space is None),
                 help="Its driver runs in the background: the search goes on when this tab or the dashboard closes."):
        try:
            search_id = create_search(config, space, data_roots=options.data_roots())
            start_detached_driver(search_id, data_roots=options.data_roots())
        except Exception as exc:  # a search that cannot start (a model that fails its check, disk full) must say why
            st.error(f"The search could not be started: {escape_markdown(exc)}")
        else:
            launch_memory.remember(launch_memory.FormStart(config))
            state.open_search(search_id)
elif sweeping:
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
                       "code into the dashboard; `parallax estimate --model ...` gives them.")
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
