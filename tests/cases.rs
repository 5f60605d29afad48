//! Every `plugins/<node>/cases/*.toml` runs against `plugins/<node>.wasm` with a
//! fresh fixture MCP server, through the same code as `wf-host test`.

mod common;

use wf_host::testing::{Case, CaseOptions, run_case};

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_plugin_case_passes() {
    let cache = tempfile::tempdir().unwrap();
    let opts = CaseOptions {
        wf_host_exe: wf_host_bin(),
        cache_dir: Some(cache.path().to_path_buf()),
        record: None,
    };
    let plugins = repo_root().join("plugins");
    let expected = case_files_on_disk(&plugins);
    let mut ran = 0;
    let mut failures = Vec::new();
    let mut dirs: Vec<_> = std::fs::read_dir(&plugins)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    dirs.sort();
    for dir in dirs {
        let cases_dir = dir.join("cases");
        if !cases_dir.is_dir() {
            continue;
        }
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let component = plugins.join(format!("{name}.wasm"));
        assert!(
            component.exists(),
            "{} is missing; run ./plugins/build.sh",
            component.display()
        );
        let mut cases: Vec<_> = std::fs::read_dir(&cases_dir)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();
        cases.sort();
        for path in cases {
            let case = Case::load(&path).unwrap();
            let report = run_case(&component, &case, &opts).await.unwrap();
            ran += 1;
            if !report.passed() {
                failures.push(format!("FAIL {}\n{}", path.display(), report.render()));
            }
        }
    }
    assert!(expected > 0, "no case files under {}", plugins.display());
    assert_eq!(
        ran, expected,
        "ran {ran} of the {expected} case files on disk"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `plugins/*/cases/*.toml`, counted apart from the loop that runs them.
fn case_files_on_disk(plugins: &std::path::Path) -> usize {
    std::fs::read_dir(plugins)
        .unwrap()
        .flatten()
        .filter_map(|plugin| std::fs::read_dir(plugin.path().join("cases")).ok())
        .flat_map(|cases| cases.flatten())
        .filter(|case| case.path().extension().is_some_and(|e| e == "toml"))
        .count()
}
