"""What a plugrt backend is: the hook specifications.

A backend is a Python module that a distribution registers under the entry-point
group ``plugrt`` (or that PLUGRT_EXTRA_PLUGINS names). That module imports only the
standard library and plugrt, and implements some of the hooks below, each marked
with ``@hookimpl``. Heavy dependencies (a driver binding, a compiler library,
numpy) are imported inside the hooks that build objects, never at module level.

A backend's life, and when each hook runs:

1. Discovery, once per process: plugrt imports the module and calls
   ``plugrt_backends()`` and ``plugrt_interfaces()``. The declarations they return
   are plain data: names, priorities, compilers, interfaces, probes, and the plugin
   API version the module was written against (checked before anything else runs).
2. Probing, whenever a device list is wanted: ``BackendSpec.probe(ctx)`` and the
   compilers' and interfaces' probes look at the machine cheaply (files, paths,
   importable modules) and change nothing: no allocation, no driver state. `ctx`
   is the registry's plugrt.context.PluginContext: its environment (``ctx.env``,
   validated readers like ``ctx.integer("PLUGRT_X", 4, lo=1)``), the user's
   selection (``ctx.target("CL")``) and looks at the machine through that
   environment (``ctx.which``, ``ctx.find_library``). A backend reads settings
   there and never from os.environ, so ``Registry(env=...)`` governs all of them.
   (A probe with no parameter, as plugin API 1.0 and 1.1 wrote them, still works.)
3. Opening, once per device (``Device["CUDA:1"]``): ``plugrt_open_device`` may set
   up shared state (a context, a queue), then ``plugrt_allocator``,
   ``plugrt_program`` and ``plugrt_compiler`` each build their object once.
   Every hook gets the DeviceInfo; ``device.context`` is the same PluginContext.
4. Launching: the core calls the objects built in step 3 directly. No hook, no
   registry lookup and no pluggy call sits between a user and a kernel launch.

A hook that raises, a module that fails to import, a declaration with another major
API version, a name the DEV grammar cannot hold, a backend name that two distributions
declare, or an import, probe or open that overruns its time limit (PLUGRT_PROBE_TIMEOUT,
PLUGRT_OPEN_TIMEOUT), makes that backend unavailable with a typed reason
(plugrt.errors.Reason); other backends and ``import plugrt`` are never affected. ``plugrt devices`` shows every reason.

The objects the hooks build derive from the base classes in plugrt.runtime
(Allocator, Compiler, Program, DeviceState); what every hook receives, DeviceInfo, and
what every probe receives, PluginContext, live in the leaf module plugrt.context and are
importable from here too. docs/authoring.md walks through a new backend, and
plugrt.reference is a complete one to copy.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Optional, TypeVar

from plugrt.context import DeviceInfo, PluginContext
from plugrt.errors import Reason

if TYPE_CHECKING:
  from plugrt.launchargs import Signature
  from plugrt.runtime import Allocator, Compiler, DeviceState, Program

PROJECT = "plugrt"
#: The plugin API this core implements. A backend declaring another major version is
#: refused; one declaring a newer minor version than this is refused too.
PLUGIN_API_VERSION = (1, 3)  # 1.1: plugrt_graph; 1.2: probes may take the PluginContext, DeviceInfo.context;
#                              1.3: Probe.devices, plugrt_collective_engines

_F = TypeVar("_F", bound=Callable[..., Any])


# ---------------------------------------------------------------- the markers
# pluggy's marker classes, made by hand: they set the same attributes (``plugrt_spec``, ``plugrt_impl``) with the same
# options, so pluggy reads these specs and plugins unchanged (Registry.plugin_manager), and a plugin marked with
# ``pluggy.HookimplMarker("plugrt")`` is found as well. What they save is importing pluggy, with `inspect` and `typing`'s
# company, in every process that lists devices (about half of discovery's time; docs/performance.md).

def hookspec(function: _F | None = None, firstresult: bool = False, historic: bool = False,
             warn_on_impl: Warning | None = None, warn_on_impl_args: Mapping[str, Warning] | None = None) -> Any:
  """Mark a function of this module as a hook specification (pluggy's ``HookspecMarker("plugrt")``)."""
  def mark(func: _F) -> _F:
    if historic and firstresult: raise ValueError("cannot have a historic firstresult hook")
    setattr(func, f"{PROJECT}_spec", {"firstresult": firstresult, "historic": historic, "warn_on_impl": warn_on_impl,
                                      "warn_on_impl_args": warn_on_impl_args})
    return func
  return mark(function) if function is not None else mark


def hookimpl(function: _F | None = None, hookwrapper: bool = False, optionalhook: bool = False, tryfirst: bool = False,
             trylast: bool = False, specname: str | None = None, wrapper: bool = False) -> Any:
  """Mark a plugin's function as its implementation of the hook of the same name (or `specname`), as pluggy's
  ``HookimplMarker("plugrt")`` does. plugrt calls each plugin's own implementation directly, never a chain, so
  `tryfirst`/`trylast` change nothing and wrappers (`hookwrapper`, `wrapper`) are refused at discovery;
  `optionalhook=True` lets a plugin implement a hook this plugrt does not define (a newer API's) without being refused."""
  def mark(func: _F) -> _F:
    setattr(func, f"{PROJECT}_impl", {"wrapper": wrapper, "hookwrapper": hookwrapper, "optionalhook": optionalhook,
                                      "tryfirst": tryfirst, "trylast": trylast, "specname": specname})
    return func
  return mark(function) if function is not None else mark


# ---------------------------------------------------------------- declarations (plain data)
# Immutable records, as NamedTuples: discovery imports this module in every process, and a frozen
# dataclass compiles six methods with exec at import (a NamedTuple costs far less).

class DeviceListing(NamedTuple):
  """One device of a backend as its probe sees it without opening it, for `plugrt devices` (Probe.devices)."""
  index: int                        # what Device["NAME:index"] opens
  name: str                         # the model, as the driver names it
  bus_id: str = ""                  # its PCI location, "0000:18:00.0"; "" where it has none
  info: Mapping[str, str] = {}      # more facts (a UUID, the physical GPU an index maps to); read only


class Probe(NamedTuple):
  """What a cheap, side-effect-free look at the machine found."""
  ok: bool
  count: int = 0                    # devices found (for a compiler or interface: 1 if usable)
  reason: Optional[Reason] = None   # why not ok
  detail: str = ""                  # what was found, or what is missing
  hint: str = ""                    # how to fix it
  info: Mapping[str, str] = {}       # extra facts for `plugrt devices` (adapters, versions); read only
  devices: tuple[DeviceListing, ...] = ()  # optional: each device with its index, model and bus (see with_devices)

  @staticmethod
  def found(count: int = 1, detail: str = "", **info: str) -> Probe: return Probe(True, count, None, detail, "", info)
  @staticmethod
  def missing(reason: Reason, detail: str, hint: str = "", **info: str) -> Probe: return Probe(False, 0, reason, detail, hint, info)

  def with_devices(self, devices: Sequence[DeviceListing]) -> Probe:
    """This probe with its per-device listing, read where the probe reads anyway (a proc file, sysfs), never by
    opening a device: `plugrt devices` prints one line per entry."""
    return self._replace(devices=tuple(devices))


#: A probe: ``probe(ctx)`` (plugin API 1.2), or ``probe()`` (1.0, 1.1). plugrt.registry.takes_context tells them apart.
ProbeFn = Callable[[PluginContext], Probe] | Callable[[], Probe]


class CompilerSpec(NamedTuple):
  """A way to turn kernel IR into a binary for the device.

  Chosen with ``<DEVICE>_<NAME>=1`` or ``DEV=<DEVICE>:<NAME>``; otherwise the first
  compiler whose probe succeeds is the device's default.
  """
  name: str
  description: str = ""
  probe: Optional[ProbeFn] = None   # is its toolchain here? None: always


class InterfaceSpec(NamedTuple):
  """A way to reach the device's hardware (a driver, a bus). Declared by the device's
  own package or by a separate interface package.

  Chosen with ``<DEVICE>_IFACE=<NAME>`` or ``DEV=<NAME>+<DEVICE>``; otherwise the first
  interface with ``auto=True`` whose probe succeeds. Interfaces that can unbind a
  kernel driver must set ``auto=False``.
  """
  device: str
  name: str
  probe: ProbeFn
  auto: bool = True
  description: str = ""
  priority: int = 0   # automatic choice among a device's interfaces: highest first, then declaration order


class Alias(NamedTuple):
  """An older environment name: ``Alias("CLANG", "CPU:CLANG")`` makes CLANG=1 mean DEV=CPU:CLANG."""
  env: str
  target: str


class BackendSpec(NamedTuple):
  """One device kind: what ``plugrt_backends`` returns."""
  name: str                                    # upper case: CPU, CUDA, ... (also the <NAME>=1 variable)
  api_version: str | tuple[int, int]           # the plugin API it was written for: "1.1", or (1, 1) (PLUGIN_API_VERSION)
  probe: ProbeFn                               # are there devices of this kind here?
  compilers: tuple[CompilerSpec, ...] = ()     # in order of preference
  priority: int = 0                            # automatic choice: highest first, ties by name
  aliases: tuple[Alias, ...] = ()
  interfaces: tuple[InterfaceSpec, ...] = ()   # interfaces this package ships itself
  description: str = ""


class VideoDecoderSpec(NamedTuple):
  """A video decoder a plugin provides: what ``plugrt_video_decoders`` returns (plugrt.video uses it; docs/video.md).

  ``open(device, stream, info, options)`` builds a decoder for one stream, called once per stream (never per frame):
  `device` is the opened plugrt.device.RuntimeDevice the frames' surfaces live on, `stream` the Annex B bytes,
  `info` the plugrt.video.hevc.StreamInfo of its parameter sets, `options` a dict (``queue_depth``). It returns an
  object with ``frames()`` (an iterator of plugrt.video.Frame in display order) and ``close()``, and raises
  plugrt.errors.VideoDecoderUnavailable when the hardware cannot take the stream (its capabilities, say).
  """
  name: str                        # upper case: NVDEC, VAAPI, VIDEOTOOLBOX
  device: str                      # the device kind whose memory holds the surfaces ("CUDA"); "" for host memory
  probe: ProbeFn                   # cheap, side-effect free, as a backend's probe
  open: Callable[..., Any]         # the factory above; it imports the decoder's module when called
  codecs: tuple[str, ...] = ("hevc",)
  priority: int = 0                # automatic choice among usable decoders: highest first, then by name
  description: str = ""


#: Loads a compiled binary as a Program on an opened device: factory(device, name, binary, signature).
#: `device` is the plugrt.device.RuntimeDevice; programs check buffers against it.
ProgramFactory = Callable[[Any, str, bytes, "Signature"], "Program"]


# ---------------------------------------------------------------- the hooks

@hookspec
def plugrt_backends() -> Sequence[BackendSpec]:
  """Declare the device kinds this plugin provides. Called once, at discovery.

  Must be cheap and import nothing beyond the standard library and plugrt.
  """


@hookspec
def plugrt_interfaces() -> Sequence[InterfaceSpec]:
  """Declare interfaces this plugin provides, for its own or another plugin's device."""


@hookspec
def plugrt_open_interface(device: DeviceInfo, interface: str) -> Any:
  """Open `interface` (declared by this plugin) for `device`; the result reaches the
  device's own hooks as ``device.iface_object``. Called once per device."""


@hookspec
def plugrt_open_device(device: DeviceInfo) -> DeviceState | None:
  """Set up what the device's objects share (a context, queues). Called once per device,
  before the other factories; the result is ``device.state``."""


@hookspec
def plugrt_allocator(device: DeviceInfo) -> Allocator:
  """Build the device's memory allocator. Called once per device."""


@hookspec
def plugrt_compiler(device: DeviceInfo, compiler: str) -> Compiler:
  """Build the compiler named `compiler` (one of the declared CompilerSpecs) for the device.
  Called once per device and compiler."""


@hookspec
def plugrt_program(device: DeviceInfo) -> ProgramFactory:
  """Return the factory that loads compiled binaries as Programs. Called once per device."""


@hookspec
def plugrt_graph(device: DeviceInfo) -> Callable[[Any, Sequence[Any]], Any] | None:
  """Optional: return a factory(device, launches) -> plugrt.runtime.Graph that replays a batch of
  launches more cheaply than one call each (CUDA graphs, a command buffer). Called once per device;
  without it plugrt replays graphs launch by launch."""


@hookspec
def plugrt_video_decoders() -> Sequence[VideoDecoderSpec]:
  """Optional: declare the video decoders this plugin provides (plain data, imports nothing heavy). Called once per
  registry, when plugrt.video first looks for a decoder or `plugrt devices` lists them; never per frame."""


class CollectiveEngineSpec(NamedTuple):
  """A collective engine a plugin provides: what ``plugrt_collective_engines`` returns (plugrt.distributed uses it;
  docs/distributed.md). NCCL for CUDA is one; RCCL for AMD would be another.

  ``open(request)`` builds the engine objects once, when a communicator is made (never per collective): `request` is
  a plugrt.distributed.EngineRequest (the opened devices, this process's ranks, the world size, a `share` function
  that hands rank 0's bytes to every rank, the timeout). It returns one plugrt.distributed.Engine per device of the
  request, and raises plugrt.errors.CollectiveUnavailable when it cannot serve them.
  """
  name: str                        # upper case: NCCL, RCCL, MPI
  device: str                      # the device kind whose buffers it moves ("CUDA"); "" for any device, through host memory
  probe: ProbeFn                   # cheap, side-effect free, as a backend's probe (is the library there?)
  open: Callable[..., Any]         # the factory above; it imports the engine's module when called
  local: bool = False              # one process may drive several devices (Communicator.local)
  priority: int = 0                # automatic choice among usable engines: highest first, then by name
  description: str = ""
  unique_id: Optional[Callable[[PluginContext], bytes]] = None  # unique_id(ctx): the id ranks share (NCCL's ncclUniqueId), for from_id


@hookspec
def plugrt_collective_engines() -> Sequence[CollectiveEngineSpec]:
  """Optional (plugin API 1.3): declare the collective engines this plugin provides (plain data, imports nothing
  heavy). Called once per registry, when plugrt.distributed first makes a communicator; never per collective."""


#: hooks every backend plugin must implement (the rest are optional)
REQUIRED_DEVICE_HOOKS = ("plugrt_allocator", "plugrt_compiler", "plugrt_program")
