//! The PTX that build.rs embeds, and the probe modules it builds for the tests and benches:
//! right targets, exactly the entry points of the kernel families' tables, the instructions the
//! kernels are meant to use, and a clean assembly by `ptxas` (from the PyPI package
//! `nvidia-cuda-nvcc`) with no spills.

mod common;
#[path = "common/probe.rs"]
mod probe;

// The kernel families' tables of entry points: the very files the kernels and their launchers
// compile.
#[allow(dead_code)]
#[path = "../kernels-gpu/src/attention/layout.rs"]
mod attention;
#[allow(dead_code)]
#[path = "../kernels-gpu/src/matmul_nbits/layout.rs"]
mod matmul_nbits;
#[allow(dead_code)]
#[path = "../kernels-gpu/src/matmul_w8a8/layout.rs"]
mod matmul_w8a8;
#[allow(dead_code)]
#[path = "../kernels-gpu/src/paged_attention/layout.rs"]
mod paged_attention;
#[allow(dead_code)]
#[path = "../kernels-gpu/src/rmsnorm/layout.rs"]
mod rmsnorm;

use std::collections::BTreeSet;

use dlkern::runtime::ptx;

/// The probe modules (`common/probe.rs`), which only the tests and benches load.
fn probe_modules() -> impl Iterator<Item = ptx::Module> {
    probe::PTX_MODULES.iter().map(ptx::Module::of)
}

/// The production modules (the library's) and the probe modules.
fn all_modules() -> impl Iterator<Item = (&'static str, ptx::Module)> {
    ptx::modules().map(|m| ("kernels", m)).chain(probe_modules().map(|m| ("probes", m)))
}

/// The names of a module's entry points.
fn entries(text: &'static str) -> BTreeSet<&'static str> {
    let headers = text.lines().filter_map(|line| line.trim_start().strip_prefix(".visible .entry "));
    headers.map(|rest| rest.split('(').next().unwrap_or(rest)).collect()
}

/// The symbols of an entry-point table.
fn names<K>(table: &'static [(K, &'static str)]) -> impl Iterator<Item = &'static str> {
    table.iter().map(|&(_, name)| name)
}

/// The entries the families' tables give `module`: all of theirs, but the arch-specific (sm_90a)
/// ones in that module only.
fn table_entries(module: &ptx::Module) -> BTreeSet<&'static str> {
    let w8a8 = matmul_w8a8::ENTRIES.iter().filter(|(e, _)| module.arch_specific || !e.arch_specific());
    let attention = attention::ENTRIES.iter().filter(|(e, _)| module.arch_specific || !e.arch_specific());
    let families =
        names(rmsnorm::ENTRIES).chain(attention.map(|&(_, name)| name)).chain(names(paged_attention::ENTRIES));
    let nbits_hopper: &[&str] = if module.arch_specific { matmul_nbits::HOPPER_ENTRIES } else { &[] };
    let nbits = matmul_nbits::ENTRIES.iter().chain(nbits_hopper).copied();
    families.chain(w8a8.map(|&(_, name)| name)).chain(nbits).collect()
}

fn assert_same_entries(what: &str, have: &BTreeSet<&str>, want: &BTreeSet<&str>) {
    let missing: Vec<_> = want.difference(have).collect();
    let unlisted: Vec<_> = have.difference(want).collect();
    assert!(
        missing.is_empty() && unlisted.is_empty(),
        "{what}: entries missing from the PTX {missing:?}, entries in no table {unlisted:?}"
    );
}

#[test]
fn ships_sm80_and_sm90a() {
    let targets: Vec<String> = ptx::modules().map(|m| m.target()).collect();
    assert_eq!(targets, vec!["sm_90a", "sm_80"]);
    let probe_targets: Vec<String> = probe_modules().map(|m| m.target()).collect();
    assert_eq!(probe_targets, targets, "a probe module for each module");
}

#[test]
fn each_module_has_exactly_the_entries_of_the_families_it_ships() {
    for module in ptx::modules() {
        let (target, text) = (module.target(), module.text);
        assert!(text.lines().any(|l| l.trim() == format!(".target {target}")), "{target}: .target line");
        let have = entries(text);
        assert_same_entries(&target, &have, &table_entries(&module));
        assert!(!have.iter().any(|e| e.starts_with("probe_")), "{target}: a probe in a production module");
        if !module.arch_specific {
            assert!(!text.contains("wgmma"), "{target}: wgmma outside the arch-specific module");
        }
    }
    for module in probe_modules() {
        let target = module.target();
        assert!(module.text.lines().any(|l| l.trim() == format!(".target {target}")), "probes {target}: .target");
        assert_same_entries(
            &format!("probes {target}"),
            &entries(module.text),
            &probe::layout::ENTRIES
                .iter()
                .filter(|(e, _)| module.arch_specific || !e.arch_specific())
                .map(|&(_, name)| name)
                .collect(),
        );
    }
}

/// The W4 `wgmma` pair entries run as clusters of their two K splits: the build put the
/// directive into their headers (and into no other entry).
#[test]
fn split_entries_require_clusters_of_their_splits() {
    let module = ptx::modules().find(|m| m.arch_specific).expect("an sm_90a module");
    let clustered = [
        ("matmul_nbits_wgmma_pair_f16", 2),
        ("matmul_nbits_wgmma_pair_bf16", 2),
        ("matmul_nbits_wgmma_pair_any_f16", 2),
        ("matmul_nbits_wgmma_pair_any_bf16", 2),
    ];
    for (entry, splits) in &clustered {
        let at = module.text.find(&format!(".visible .entry {entry}(")).expect(entry);
        let header = &module.text[at..at + module.text[at..].find("\n{").expect("a body")];
        assert!(header.ends_with(&format!(")\n.reqnctapercluster 1, 1, {splits}")), "{entry}: {header}");
    }
    assert_eq!(module.text.matches("\n.reqnctapercluster").count(), clustered.len());
}

#[test]
fn kernels_use_the_intended_instructions() {
    let expected = [
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32",
        "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
        "cp.async.cg.shared.global",
        "cp.async.wait_group 0",
        "ex2.approx.ftz.f32",
        "rsqrt.approx.ftz.f32",
        "ld.global.nc.v4.u32",
        "st.global.v4.u32",
        "shfl.sync.bfly.b32",
        "cvt.rn.bf16x2.f32",
        "red.global.or.b32",
        "bar.red.or.pred",
    ];
    let hopper = [
        "wgmma.mma_async.sync.aligned.m64n256k32.s32.s8.s8",
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16",
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16",
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16",
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16",
        // The attention kernel: P V with V transposed by the instruction (d128, d64).
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {",
        ", p, 1, 1, 1; }",
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16",
        ", p, 1, 1, 0, 0; }",
        // Its producer warpgroup: tensor copies (TMA) through maps passed as 64-byte-aligned
        // parameters, the partial last tile by cp.async, copies tracked by mbarriers, registers
        // handed to the consumers.
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes",
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes",
        "prefetch.tensormap",
        "cvta.param.u64",
        ".param .align 64 .b8 attention_fwd_wgmma_f16_d128_param_0[128]",
        "cp.async.mbarrier.arrive.noinc.shared::cta.b64",
        "setmaxnreg.dec.sync.aligned.u32 24",
        "setmaxnreg.inc.sync.aligned.u32 240",
        ".maxntid 384, 1, 1",
        "wgmma.fence.sync.aligned",
        "wgmma.commit_group.sync.aligned",
        "wgmma.wait_group.sync.aligned",
        "fence.proxy.async.shared::cta",
        "mapa.shared::cluster.u32",
        "ld.shared::cluster.v4.u32",
        "barrier.cluster.arrive.release.aligned",
        "st.release.gpu.global.u32",
        "ld.acquire.gpu.global.u32",
        "nanosleep.u32",
        "ld.global.cg.v4.u32",
        "griddepcontrol.launch_dependents",
        "griddepcontrol.wait",
    ];
    for module in ptx::modules() {
        let (sm, text) = (module.target(), module.text);
        let extra: &[&str] = if module.arch_specific { &hopper } else { &[] };
        for instruction in expected.iter().chain(extra) {
            assert!(text.contains(instruction), "{sm}: no `{instruction}` in the PTX");
        }
        // Grid dependency control is sm_90's: the portable module has none.
        if !module.arch_specific {
            assert!(!text.contains("griddepcontrol"), "{sm}: griddepcontrol in the portable module");
        }
        // A panic path compiled into a kernel would show up as a trap: the kernels have none.
        assert!(!text.contains("trap;"), "{sm}: a kernel contains a panic path (trap)");
    }
}

#[test]
fn probes_use_the_instructions_they_test() {
    let expected = [
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32",
        "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
        "ldmatrix.sync.aligned.m8n8.x2.shared.b16",
        "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16",
        "cp.async.cg.shared.global",
        "cp.async.wait_group 0",
        "ex2.approx.ftz.f32",
        "rcp.approx.ftz.f32",
        "rsqrt.approx.ftz.f32",
        "ld.global.nc.v4.u32",
        "shfl.sync.bfly.b32",
    ];
    let hopper = [
        "griddepcontrol.launch_dependents",
        "griddepcontrol.wait",
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes",
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes",
        "mbarrier.test_wait.parity.acquire.cta.shared::cta.b64",
        ".param .align 64 .b8 probe_tma_load_param_0[128]",
    ];
    for module in probe_modules() {
        let (sm, text) = (module.target(), module.text);
        let extra: &[&str] = if module.arch_specific { &hopper } else { &[] };
        for instruction in expected.iter().chain(extra) {
            assert!(text.contains(instruction), "probes {sm}: no `{instruction}` in the PTX");
        }
        if !module.arch_specific {
            assert!(!text.contains("griddepcontrol"), "probes {sm}: griddepcontrol in the portable module");
        }
        assert!(!text.contains("trap;"), "probes {sm}: a kernel contains a panic path (trap)");
    }
}

/// The kernels the host launches as programmatic dependents (`Device::launch_overlapping`)
/// wait for the previous grid in the sm_90a module, and the decode kernels and the permutation
/// let the next one start only after that wait (so what the next copies early overlaps them
/// alone).
#[test]
fn programmatic_dependents_wait_for_the_previous_grid() {
    let module = ptx::modules().find(|m| m.arch_specific).expect("an sm_90a module");
    let body = |entry: &str| entry_body(module.text, entry);
    for t in ["f16", "bf16"] {
        let decode = [
            "decode8",
            "decode8_ahead3",
            "decode16",
            "decode8_packed",
            "decode8_packed_wide",
            "decode16_packed",
            "decode16_packed_wide",
        ];
        let entries = decode.map(|kernel| format!("matmul_nbits_{kernel}_{t}"));
        for entry in entries.into_iter().chain([format!("matmul_nbits_permute_{t}")]) {
            let text = body(&entry);
            let (wait, launch) = (text.rfind("griddepcontrol.wait;"), text.find("griddepcontrol.launch_dependents;"));
            assert!(wait.is_some() && launch.is_some() && wait < launch, "{entry}: wait, then launch_dependents");
        }
        for kernel in ["wgmma", "wgmma_pair", "wgmma_streamk"] {
            let entry = format!("matmul_nbits_{kernel}_{t}");
            assert!(body(&entry).contains("griddepcontrol.wait;"), "{entry}: no griddepcontrol.wait");
        }
    }
    // The read ceiling may read before its wait, but writes only after it.
    let probes = probe_modules().find(|m| m.arch_specific).expect("an sm_90a probe module");
    let text = entry_body(probes.text, probe::layout::entry(probe::layout::Entry::StreamRead).unwrap());
    let (wait, store) = (text.rfind("griddepcontrol.wait;"), text.find("st.global"));
    assert!(wait.is_some() && store.is_some() && wait < store, "probe_stream_read: wait, then store");
}

/// The text of `entry` in a module: its header and body, up to the next entry.
fn entry_body(text: &'static str, entry: &str) -> &'static str {
    let at = text.find(&format!(".visible .entry {entry}(")).expect(entry);
    let end = text[at + 1..].find(".visible .entry ").map_or(text.len(), |e| at + 1 + e);
    &text[at..end]
}

#[test]
fn cubins_are_offered_to_the_architectures_that_run_them() {
    let module = |arch, arch_specific, cubin: &'static [u8]| ptx::Module { arch, arch_specific, text: "", cubin };
    let portable = module(80, false, b"\x7fELF");
    for (cc, runs) in
        [((8, 0), true), ((8, 6), true), ((8, 9), true), ((7, 5), false), ((9, 0), false), ((12, 0), false)]
    {
        assert_eq!(portable.cubin_for(cc.0, cc.1).is_some(), runs, "sm_80 cubin on {cc:?}");
    }
    let hopper = module(90, true, b"\x7fELF");
    for (cc, runs) in [((9, 0), true), ((10, 0), false), ((8, 9), false)] {
        assert_eq!(hopper.cubin_for(cc.0, cc.1).is_some(), runs, "sm_90a cubin on {cc:?}");
    }
    assert_eq!(module(80, false, b"").cubin_for(8, 0), None, "no cubin built");
    // Built with a ptxas (the test scripts set DLKERN_PTXAS): every shipped module has one.
    if option_env!("DLKERN_PTXAS").is_some_and(|p| !p.is_empty()) {
        for m in ptx::modules() {
            assert!(m.cubin.starts_with(b"\x7fELF"), "{}: no cubin in a build with ptxas", m.target());
        }
    }
}

#[test]
fn module_selection_follows_compute_capability() {
    let target = |major, minor| ptx::select(major, minor).map(|m| m.target());
    assert_eq!(target(9, 0).as_deref(), Some("sm_90a"));
    assert_eq!(target(8, 0).as_deref(), Some("sm_80"));
    assert_eq!(target(8, 6).as_deref(), Some("sm_80"));
    assert_eq!(target(8, 9).as_deref(), Some("sm_80"));
    // Arch-specific PTX runs on its own architecture only; newer GPUs JIT the portable module.
    assert_eq!(target(10, 0).as_deref(), Some("sm_80"));
    assert_eq!(target(12, 0).as_deref(), Some("sm_80"));
    assert_eq!(target(7, 5), None, "Turing is older than every module");
}

/// Local-memory bytes (stack frame, spill stores, spill loads) an entry may use: none, except
/// the attention kernels at head sizes 96 and 128 with 64-key tiles. There ptxas spills a few
/// words per tile (three loads per tile), and that build measured 5-7% faster on the H200
/// than the spill-free 32-key build (docs/perf-notes/attention.md). Today: at most 16/20/16
/// bytes; 32 leaves room for a compiler's whim, not for a regression to the 84-byte spills.
///
/// The KV-cache entries (`attention_fwd_cache_*`, GroupQueryAttention's prompts) at head size 96
/// hold three more strides through the loop and spill 32/36/52 bytes there (ptxas 13.5): 64.
/// Head size 96 is rare among LLMs that use GroupQueryAttention; the bench rows are at 128.
///
/// Also `decode8_packed_wide` and `decode8_packed`, capped at 128 registers (2 blocks of 256
/// threads, 4 of 128 per SM; the caps measured faster, docs/perf-notes/matmul_nbits.md v23 and
/// v28): spill-free under ptxas 13.5 since the records' nibble order of v28 (`decode8_packed`
/// takes 132 registers uncapped; before it the wide build spilled up to 32/68 bytes). 16 bytes leave room
/// for a compiler's whim, not for a return of those spills.
///
/// The Hopper kernel at head size 256 (`attention_fwd{,_cache}_wgmma_*_d256`): 128 output, 32
/// score and 16 probability registers per consumer thread under its 240; ptxas 13.5 spills
/// 44/44 bytes since the output is written through shared memory (48/48/60 before: about nine
/// 4-byte loads and stores per 64-key tile, against 20 `wgmma`s). 64: room
/// for a whim, not for the 2 KB it spilled while the output tile sat in local memory.
///
/// `matmul_nbits_prefill_any_*` (blocks of 16, typed zero points): the constants of both 16-K
/// halves of each chunk, for the chunk in use and the next, beside the 128 accumulators and
/// two fragment sets of a consumer thread; ptxas 13.5 spills 20-32 bytes since the constants
/// come cooked (64/68 before, five loads per chunk). 48: room for a whim, not for a return of
/// those.
fn spill_budget(entry: &str) -> u64 {
    let cache_d96 = entry.starts_with("attention_fwd_cache_") && entry.ends_with("_d96");
    let hopper_d256 = entry.starts_with("attention_fwd_") && entry.contains("_wgmma_") && entry.ends_with("_d256");
    if entry.starts_with("matmul_nbits_prefill_any_") {
        48
    } else if cache_d96 || hopper_d256 {
        64
    } else if entry.starts_with("attention_fwd_") && (entry.ends_with("_d96") || entry.ends_with("_d128")) {
        32
    } else if entry.starts_with("matmul_nbits_decode8_packed_") {
        16
    } else {
        0
    }
}

#[test]
fn ptxas_assembles_every_module_without_spills() {
    let ptxas = common::find_ptxas()
        .expect("ptxas not found: `pip install nvidia-cuda-nvcc` (the test scripts do) or set DLKERN_PTXAS");
    let dir = std::env::temp_dir().join(format!("dlkern-ptxas-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (kind, module) in all_modules() {
        let sm = module.target();
        let src = dir.join(format!("dlkern-{kind}.{sm}.ptx"));
        std::fs::write(&src, module.text).unwrap();
        let out = std::process::Command::new(&ptxas)
            .arg(format!("-arch={sm}"))
            .arg("-v")
            .arg("--warning-as-error")
            .arg(&src)
            .arg("-o")
            .arg(dir.join(format!("dlkern-{kind}.{sm}.cubin")))
            .output()
            .expect("run ptxas");
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{kind}: ptxas -arch={sm} failed:\n{log}");
        let sm = format!("{kind} {sm}");
        // ptxas reports serialized `wgmma`s (C7514, C7515) as info, not as a warning.
        assert!(!log.contains("wgmma.mma_async instructions are serialized"), "{sm}: serialized wgmma:\n{log}");
        let compiled = log.matches("Compiling entry function").count();
        assert_eq!(compiled, entries(module.text).len(), "{sm}: ptxas compiled {compiled} entries:\n{log}");
        // Per entry: "Compiling entry function 'NAME'", then a line with the stack frame and
        // spill bytes.
        let mut entry = "";
        for line in log.lines() {
            if let Some(rest) = line.split("Compiling entry function '").nth(1) {
                entry = rest.split('\'').next().unwrap_or("");
            } else if line.contains("bytes spill stores") {
                let bytes: Vec<u64> = line.split_whitespace().filter_map(|w| w.parse().ok()).collect();
                let budget = spill_budget(entry);
                assert!(
                    bytes.len() == 3 && bytes.iter().all(|&b| b <= budget),
                    "{sm}: {entry}: stack / spills over its budget of {budget} bytes: {line}\n{log}"
                );
            }
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}
