"""A run's sampled call sites as a pprof heap profile (profile.proto, gzipped), for
`go tool pprof`, the pprof web UI, Grafana Pyroscope and speedscope.

The sample types are a heap profile's, as Go's runtime writes them: alloc_objects and
alloc_space (every sampled allocation of the run, estimated), inuse_objects and inuse_space
(the blocks live at one moment: the peak by default, or exit, never freed, a snapshot).
Values are heapsight's estimates already (each sampled block stands for 1/p blocks and
size/p bytes), so the period (the sampling mean, in bytes) is recorded for information and
pprof scales nothing again. Each stack starts at its call site: the allocator's frames and
heapsight's hooks under it are left out, so that pprof's flat column is heapsight's call
site table. Frames are grouped into locations by address (inlined functions are lines of
one location, innermost first); each object gets a mapping of its own, at a synthetic base
(the record keeps addresses relative to the object: address = base + offset in the file).

The message types are built from their descriptor at first use, with the protobuf runtime
(python3-protobuf / the protobuf wheel); nothing is encoded by hand."""

from __future__ import annotations

import os

import functools
import gzip

from heapsight import analysis, sites as sites_mod
from heapsight.errors import HeapsightError

MAPPING_SPAN = 1 << 40   # each object's synthetic address range


@functools.lru_cache(maxsize=1)
def _profile_class():
    """perftools.profiles.Profile, from a descriptor built here (profile.proto's fields)."""
    try:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    except ImportError as e:
        raise HeapsightError("--pprof needs the protobuf runtime (pip install protobuf, or "
                             "apt install python3-protobuf)") from e
    T = descriptor_pb2.FieldDescriptorProto
    f = descriptor_pb2.FileDescriptorProto(name="heapsight_profile.proto",
                                           package="perftools.profiles", syntax="proto3")

    def message(name, *fields):
        m = f.message_type.add(name=name)
        for number, fname, ftype, repeated, type_name in fields:
            fd = m.field.add(name=fname, number=number, type=ftype,
                             label=T.LABEL_REPEATED if repeated else T.LABEL_OPTIONAL)
            if type_name:
                fd.type_name = ".perftools.profiles." + type_name

    I64, U64, STR, MSG, BOOL = T.TYPE_INT64, T.TYPE_UINT64, T.TYPE_STRING, T.TYPE_MESSAGE, T.TYPE_BOOL
    message("Profile", (1, "sample_type", MSG, True, "ValueType"), (2, "sample", MSG, True, "Sample"),
            (3, "mapping", MSG, True, "Mapping"), (4, "location", MSG, True, "Location"),
            (5, "function", MSG, True, "Function"), (6, "string_table", STR, True, None),
            (7, "drop_frames", I64, False, None), (8, "keep_frames", I64, False, None),
            (9, "time_nanos", I64, False, None), (10, "duration_nanos", I64, False, None),
            (11, "period_type", MSG, False, "ValueType"), (12, "period", I64, False, None),
            (13, "comment", I64, True, None), (14, "default_sample_type", I64, False, None))
    message("ValueType", (1, "type", I64, False, None), (2, "unit", I64, False, None))
    message("Sample", (1, "location_id", U64, True, None), (2, "value", I64, True, None),
            (3, "label", MSG, True, "Label"))
    message("Label", (1, "key", I64, False, None), (2, "str", I64, False, None),
            (3, "num", I64, False, None), (4, "num_unit", I64, False, None))
    message("Mapping", (1, "id", U64, False, None), (2, "memory_start", U64, False, None),
            (3, "memory_limit", U64, False, None), (4, "file_offset", U64, False, None),
            (5, "filename", I64, False, None), (6, "build_id", I64, False, None),
            (7, "has_functions", BOOL, False, None), (8, "has_filenames", BOOL, False, None),
            (9, "has_line_numbers", BOOL, False, None), (10, "has_inline_frames", BOOL, False, None))
    message("Location", (1, "id", U64, False, None), (2, "mapping_id", U64, False, None),
            (3, "address", U64, False, None), (4, "line", MSG, True, "Line"),
            (5, "is_folded", BOOL, False, None))
    message("Line", (1, "function_id", U64, False, None), (2, "line", I64, False, None),
            (3, "column", I64, False, None))
    message("Function", (1, "id", U64, False, None), (2, "name", I64, False, None),
            (3, "system_name", I64, False, None), (4, "filename", I64, False, None),
            (5, "start_line", I64, False, None))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("perftools.profiles.Profile"))


def moment_names(summary: dict) -> list:
    return [m["name"] for m in (summary.get("sites") or {}).get("moments", ())
            if m["name"] != sites_mod.ALLOCATED]


def encode(summary: dict, at: str = "peak") -> bytes:
    """The gzipped profile of a run summary's sites; `at` names the inuse moment ("peak",
    "exit", "never freed", or a snapshot's label). HeapsightError when the run sampled
    nothing or has no such moment."""
    sites = summary.get("sites")
    if not sites or not sites.get("moments"):
        raise HeapsightError("--pprof: this run has no sampled call sites (sampling was off: "
                             f"--sample-bytes 0, or {analysis.NOT_ACTIVE})")
    names = moment_names(summary)
    name = at if at in names else f"snapshot: {at}"
    inuse = sites_mod.moment(sites, name)
    if inuse is None:
        raise HeapsightError(f"--pprof-at {at}: no such moment in this run (it has: "
                             + ", ".join(n.removeprefix("snapshot: ") for n in names) + ")")
    allocated = sites_mod.moment(sites, sites_mod.ALLOCATED)
    Profile = _profile_class()
    p = Profile()
    strings = {"": 0}
    p.string_table.append("")

    def s(text) -> int:
        text = "" if text is None else str(text)
        if text not in strings:
            strings[text] = len(p.string_table)
            p.string_table.append(text)
        return strings[text]

    for t, u in (("alloc_objects", "count"), ("alloc_space", "bytes"),
                 ("inuse_objects", "count"), ("inuse_space", "bytes")):
        p.sample_type.add(type=s(t), unit=s(u))
    p.default_sample_type = s("inuse_space")
    p.period_type.type, p.period_type.unit = s("space"), s("bytes")
    p.period = int(sites.get("sample_bytes") or 0)
    p.duration_nanos = int(float(summary.get("duration_s") or 0) * 1e9)
    low = int(sites.get("sample_bytes_min") or p.period)
    high = int(sites.get("sample_bytes_max") or p.period)
    # adaptive sampling (native/src/profile.c): the mean starts fine and doubles as the
    # sampled blocks live grow (or as the profile's room runs low); a fixed mean is one
    weighted = " (each sampled block weighted by the mean it was drawn at)"
    if low == high == p.period:
        scheme = f"one per {p.period} bytes on average"
    elif low < high:
        scheme = (f"adaptive: from one per {low} to one per {high} bytes on average, coarsening "
                  "with the live sampled blocks" + weighted)
    else:
        scheme = (f"adaptive: one per {low} bytes on average (the mean coarsens with the live "
                  f"sampled blocks, up to {p.period}: not in this run)")
    p.comment.append(s(f"heapsight: inuse at {name} ({inuse['t_s']} s); estimated from "
                       f"{inuse['samples']:,} sampled blocks, {scheme}"))

    frames, stacks = sites.get("frames") or [], sites.get("stacks") or []
    mappings, functions, locations = {}, {}, {}

    def mapping_id(obj: str) -> int:
        if obj not in mappings:
            k = len(mappings) + 1
            mappings[obj] = k
            p.mapping.add(id=k, memory_start=k * MAPPING_SPAN, memory_limit=(k + 1) * MAPPING_SPAN,
                          filename=s(obj), has_functions=True, has_filenames=True,
                          has_line_numbers=True, has_inline_frames=True)
        return mappings[obj]

    # pprof groups by function name: an interpreter's function named like a native one
    # (Perl's main beside C's main) is told apart by its file
    native_names = {f.get("function") for f in frames
                    if f.get("object") not in sites_mod.INTERP_OBJECTS}

    def function_id(fr: dict) -> int:
        fname = fr.get("function") or f"{sites_mod.short_object(fr.get('object') or '')}+{fr.get('address')}"
        if fr.get("object") in sites_mod.INTERP_OBJECTS and fname in native_names:
            fname = f"{fname} ({os.path.basename(fr.get('file') or '') or fr.get('object')})"
        key = (fname, fr.get("file") or "")
        if key not in functions:
            functions[key] = len(functions) + 1
            # an interpreter's frame has no mangled name: go tool pprof would demangle
            # "<module>" as C++ into nothing
            system = "" if fr.get("object") in sites_mod.INTERP_OBJECTS else fname
            p.function.add(id=functions[key], name=s(fname), system_name=s(system),
                           filename=s(fr.get("file") or fr.get("object") or ""))
        return functions[key]

    def location_ids(stack: list) -> list:
        """One location per run of frames at one address (an inline chain)."""
        out, i = [], 0
        while i < len(stack):
            j = i + 1
            while j < len(stack) and frames[stack[j]].get("address") == frames[stack[i]].get("address") \
                    and frames[stack[j]].get("object") == frames[stack[i]].get("object"):
                j += 1
            key = tuple(stack[i:j])
            if key not in locations:
                fr = frames[stack[i]]
                m = mapping_id(fr.get("object") or "[unknown]")
                locations[key] = len(locations) + 1
                loc = p.location.add(id=locations[key], mapping_id=m,
                                     address=m * MAPPING_SPAN + int(fr.get("address") or "0", 16))
                for k in stack[i:j]:
                    loc.line.add(function_id=function_id(frames[k]), line=int(frames[k].get("line") or 0))
            out.append(locations[key])
            i = j
        return out

    values: dict = {}
    for slot, m in ((0, allocated), (2, inuse)):
        for e in (m or {}).get("stacks", ()):
            v = values.setdefault(e["stack"], [0, 0, 0, 0])
            v[slot], v[slot + 1] = int(e["blocks"]), int(e["bytes"])
    unwound = None
    for stack, v in sorted(values.items()):
        st = stacks[stack] if 0 <= stack < len(stacks) else []
        st = st[sites_mod.site_position(frames, st):] if st else st
        if st:
            ids = location_ids(st)
        else:   # the unwinder could not take this stack: one location of its own
            if unwound is None:
                m = mapping_id("[unknown]")
                unwound = len(locations) + 1
                locations[("unwound",)] = unwound
                fid = len(functions) + 1
                functions[(sites_mod.NO_STACK, "")] = fid
                p.function.add(id=fid, name=s(sites_mod.NO_STACK), system_name=s(sites_mod.NO_STACK))
                p.location.add(id=unwound, mapping_id=m, address=m * MAPPING_SPAN).line.add(function_id=fid)
            ids = [unwound]
        p.sample.add(location_id=ids, value=v)
    return gzip.compress(p.SerializeToString(), mtime=0)
