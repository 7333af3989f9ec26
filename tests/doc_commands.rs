//! Every `tracing-gpu` command that README.md and docs/*.md show, with each of its
//! flags, is one the binary has (its `--help`); every `--example` and script their
//! shell blocks run exists.
#![cfg(feature = "cli")]

mod support;

use std::collections::HashMap;
use std::time::Duration;

use support::cli::{run_cli, Limits};

const COMMANDS: [&str; 4] = ["demo", "convert", "report", "calibrate"];

fn docs() -> Vec<(String, String)> {
    let top = env!("CARGO_MANIFEST_DIR");
    let mut paths = vec![format!("{top}/README.md")];
    let mut more: Vec<_> = std::fs::read_dir(format!("{top}/docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .map(|p| p.display().to_string())
        .collect();
    more.sort();
    paths.extend(more);
    paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (p.trim_start_matches(top).to_string(), text)
        })
        .collect()
}

/// The `--flags` of `rest` (the words after a command, up to the end of a code span).
fn flags(rest: &str) -> Vec<String> {
    rest.split(['`', '\n'])
        .next()
        .unwrap()
        .split(|c: char| c.is_whitespace() || "[]()|\\".contains(c))
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .map(|w| {
            w.split('=')
                .next()
                .unwrap()
                .trim_end_matches([',', '.', ':'])
                .to_string()
        })
        .collect()
}

#[test]
fn the_documented_commands_and_flags_exist() {
    let mut help = HashMap::new();
    let mut checked = 0;
    for (doc, text) in docs() {
        for (at, _) in text.match_indices("tracing-gpu ") {
            let rest = &text[at + "tracing-gpu ".len()..];
            let Some(command) = COMMANDS.iter().find(|c| {
                rest.starts_with(*c) && !rest[c.len()..].starts_with(|x: char| x.is_alphanumeric())
            }) else {
                continue;
            };
            let help = help.entry(*command).or_insert_with(|| {
                let run = run_cli(&[*command, "--help"], Limits::wall(Duration::from_secs(30)));
                assert_eq!(run.code, Some(0), "{command} --help: {}", run.stderr);
                run.stdout
            });
            for flag in flags(&rest[command.len()..]) {
                assert!(
                    help.contains(&flag),
                    "{doc}: `tracing-gpu {command}` has no {flag}"
                );
                checked += 1;
            }
        }
        // `cargo run … -- <command> …`: the binary's commands too.
        for (at, _) in text.match_indices("--features full -- ") {
            let rest = &text[at + "--features full -- ".len()..];
            let command = rest.split_whitespace().next().unwrap();
            // "`… -- <command>` runs it": a placeholder, not a command.
            if !command.starts_with('<') {
                assert!(COMMANDS.contains(&command), "{doc}: no command {command}");
            }
        }
        // What the shell blocks run (prose may tell of a program as it was).
        let shell: String = text
            .split("\n```sh\n")
            .skip(1)
            .map(|b| b.split("\n```").next().unwrap())
            .collect::<Vec<_>>()
            .join("\n");
        let text = shell;
        for (at, _) in text.match_indices("--example ") {
            let name = text[at + "--example ".len()..]
                .split_whitespace()
                .next()
                .unwrap();
            let path = format!("{}/examples/{name}.rs", env!("CARGO_MANIFEST_DIR"));
            assert!(
                std::path::Path::new(&path).exists(),
                "{doc}: no example {name}"
            );
        }
        for (at, _) in text.match_indices("scripts/") {
            let name: String = text[at..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || "/-_.".contains(*c))
                .collect();
            let name = name.trim_end_matches('.');
            let path = format!("{}/{name}", env!("CARGO_MANIFEST_DIR"));
            assert!(std::path::Path::new(&path).exists(), "{doc}: no {name}");
        }
    }
    // The check can fail: the docs show flags.
    assert!(checked >= 15, "{checked} flags checked");
}
