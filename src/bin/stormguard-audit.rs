//! `stormguard-audit TOOLS.toml [--json] [--scan DIR] [--mcp TOOLS_LIST.json]`: prints the tool
//! table and its findings. `--mcp` audits the table against an MCP server's `tools/list` answer
//! (its names and annotations). Exits 1 on any error finding, 2 on a file that cannot be read or
//! checked, 0 otherwise.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use stormguard::tool::{scan, ListedTool, Toolbox};

const USAGE: &str =
    "usage: stormguard-audit TOOLS.toml|TOOLS.json [--json] [--scan DIR] [--mcp TOOLS_LIST.json]";

fn rs_files(dir: &Path, out: &mut Vec<(String, String)>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            rs_files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push((path.display().to_string(), std::fs::read_to_string(&path)?));
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let mut file: Option<PathBuf> = None;
    let mut json = false;
    let mut scan_dir: Option<PathBuf> = None;
    let mut mcp_file: Option<PathBuf> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--json" => json = true,
            "--scan" | "--mcp" => {
                let Some(path) = args.next().map(PathBuf::from) else {
                    eprintln!("{a} needs a path\n{USAGE}");
                    return ExitCode::from(2);
                };
                if a == "--scan" {
                    scan_dir = Some(path);
                } else {
                    mcp_file = Some(path);
                }
            }
            _ if file.is_none() && !a.starts_with("--") => file = Some(PathBuf::from(a)),
            _ => {
                eprintln!("{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let Some(file) = file else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let text = match std::fs::read_to_string(&file) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{}: {e}", file.display());
            return ExitCode::from(2);
        }
    };
    let parsed = if file.extension().is_some_and(|e| e == "json") {
        Toolbox::from_json_str(&text)
    } else {
        Toolbox::from_toml_str(&text)
    };
    let toolbox = match parsed {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{}: {e}", file.display());
            return ExitCode::from(2);
        }
    };
    let audit = match mcp_file {
        None => toolbox.audit(),
        Some(path) => {
            let listed = std::fs::read_to_string(&path)
                .map_err(|e| e.to_string())
                .and_then(|t| serde_json::from_str(&t).map_err(|e| e.to_string()))
                .and_then(|v| ListedTool::from_tools_list(&v).map_err(|e| e.to_string()))
                .and_then(|listed| toolbox.audit_against(&listed).map_err(|e| e.to_string()));
            match listed {
                Ok(audit) => audit,
                Err(e) => {
                    eprintln!("{}: {e}", path.display());
                    return ExitCode::from(2);
                }
            }
        }
    };
    let mut hits = Vec::new();
    if let Some(dir) = scan_dir {
        let mut files = Vec::new();
        if let Err(e) = rs_files(&dir, &mut files) {
            eprintln!("{}: {e}", dir.display());
            return ExitCode::from(2);
        }
        let pairs: Vec<(&str, &str)> = files
            .iter()
            .map(|(p, t)| (p.as_str(), t.as_str()))
            .collect();
        hits = scan(&pairs, 10);
    }
    if json {
        let v = serde_json::json!({ "audit": audit, "scan": hits });
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    } else {
        print!("{}", audit.to_markdown());
        for h in &hits {
            println!(
                "- **error** `{}:{}` `random-idempotency-key`: {}",
                h.path, h.line, h.text
            );
        }
    }
    if audit.has_errors() || !hits.is_empty() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
