//! Embeds the numbered migrations found in `migrations/` (`NNNN_name.sql`), in order, so a new one is
//! a new file and nothing else. A gap or a repeated number stops the build with the file's name.

use std::fmt::Write as _;
use std::path::Path;

fn main() {
    let dir =
        Path::new(&std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR")).join("migrations");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut found: Vec<(i32, String, String)> = std::fs::read_dir(&dir)
        .expect("read server/migrations")
        .map(|entry| entry.expect("read server/migrations").path())
        .filter(|path| path.extension().is_some_and(|e| e == "sql"))
        .map(|path| {
            let file = path.file_name().and_then(|f| f.to_str()).expect("a migration's name is UTF-8").to_owned();
            let (number, name) = file
                .strip_suffix(".sql")
                .and_then(|stem| stem.split_once('_'))
                .filter(|(number, _)| number.len() == 4)
                .unwrap_or_else(|| panic!("{file}: a migration is named NNNN_name.sql"));
            let version = number.parse().unwrap_or_else(|_| panic!("{file}: NNNN is its number"));
            (version, name.to_owned(), path.display().to_string())
        })
        .collect();
    found.sort();
    let mut out = String::from("pub const MIGRATIONS: &[Migration] = &[\n");
    for (i, (version, name, path)) in found.iter().enumerate() {
        assert_eq!(*version, i as i32 + 1, "{path}: migrations are numbered from 1 without gaps or repeats");
        writeln!(out, "    Migration {{ version: {version}, name: {name:?}, sql: include_str!({path:?}) }},").unwrap();
    }
    out.push_str("];\n");
    let target = Path::new(&std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("migrations.rs");
    std::fs::write(target, out).expect("write the migrations' list");
}
