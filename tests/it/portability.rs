//! The workspace builds for Linux, macOS and Windows: a Linux-only API (`/proc`, raw `SYS_` calls,
//! pidfds, `prctl`, epoll, inotify) may appear only in code compiled for Linux alone, that is
//! under a `cfg` that holds on neither macOS nor Windows. Checked by reading every source file of
//! every crate as the compiler does (following `mod` declarations from each crate's roots), not by
//! searching text: a comment may name `/proc`, a function outside a `cfg(target_os = "linux")` may
//! not.

use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::punctuated::Punctuated;
use syn::visit::{self, Visit};
use syn::{Attribute, Expr, Meta, Token};

/// What no code outside Linux's may name: identifiers holding these (any case) ...
const LINUX_IDENTIFIERS: [&str; 4] = ["pidfd", "prctl", "epoll", "inotify"];
/// ... or starting with `SYS_` (raw system call numbers), and strings naming `/proc`.
const SYSCALL_PREFIX: &str = "SYS_";
const PROC: &str = "/proc";

/// Two systems the code must build for besides Linux, as `cfg` sees them.
#[derive(Clone, Copy)]
struct Target {
    os: &'static str,
    family: &'static str,
}

const ELSEWHERE: [Target; 2] = [Target { os: "macos", family: "unix" }, Target { os: "windows", family: "windows" }];

/// Whether a `cfg` predicate may hold on `target`. What it does not know (features, `test`,
/// `debug_assertions`) may hold anywhere.
fn holds(meta: &Meta, target: Target) -> bool {
    let name = meta.path().get_ident().map(ToString::to_string).unwrap_or_default();
    match meta {
        Meta::Path(_) => match name.as_str() {
            "unix" | "windows" => name == target.family,
            _ => true,
        },
        Meta::NameValue(pair) => {
            let value = match &pair.value {
                Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(s), .. }) => s.value(),
                _ => return true,
            };
            match name.as_str() {
                "target_os" => value == target.os,
                "target_family" => value == target.family,
                _ => true,
            }
        }
        Meta::List(list) => {
            let Ok(inner) = list.parse_args_with(Punctuated::<Meta, Token![,]>::parse_terminated) else { return true };
            match name.as_str() {
                "all" => inner.iter().all(|m| holds(m, target)),
                "any" => inner.iter().any(|m| holds(m, target)),
                "not" => !inner.iter().next().is_some_and(|m| holds(m, target)),
                _ => true,
            }
        }
    }
}

/// Whether attributes confine what they annotate to Linux: a `cfg` that holds nowhere else.
fn linux_only(attrs: &[Attribute]) -> bool {
    attrs.iter().filter(|a| a.path().is_ident("cfg")).any(|attr| {
        let Ok(predicate) = attr.parse_args::<Meta>() else { return false };
        ELSEWHERE.iter().all(|target| !holds(&predicate, *target))
    })
}

/// A Linux-only name in a file, by line.
#[derive(Debug, PartialEq)]
struct Finding {
    line: usize,
    what: String,
}

fn banned_identifier(ident: &str) -> bool {
    let lower = ident.to_ascii_lowercase();
    ident.starts_with(SYSCALL_PREFIX) || LINUX_IDENTIFIERS.iter().any(|name| lower.contains(name))
}

/// A `mod NAME;` declaration: where its file is, and whether it is compiled for Linux alone.
#[derive(Debug, PartialEq)]
struct Module {
    name: String,
    /// Its `#[path]`, if any.
    path: Option<String>,
    linux_only: bool,
}

/// Walks one file's syntax, noting the Linux-only names outside code compiled for Linux alone,
/// and every module it declares.
#[derive(Default)]
struct Reader {
    /// Inside code compiled for Linux alone.
    gated: bool,
    findings: Vec<Finding>,
    modules: Vec<Module>,
}

impl Reader {
    fn note(&mut self, line: usize, what: String) {
        if !self.gated {
            self.findings.push(Finding { line, what });
        }
    }

    /// Visits what `attrs` annotate, as Linux's alone when they say so.
    fn within(&mut self, attrs: &[Attribute], visit: impl FnOnce(&mut Self)) {
        let was = self.gated;
        self.gated |= linux_only(attrs);
        visit(self);
        self.gated = was;
    }

    /// Macro arguments are tokens, not syntax: their strings and identifiers are read as tokens.
    fn tokens(&mut self, tokens: TokenStream) {
        for tree in tokens {
            match tree {
                TokenTree::Group(group) => self.tokens(group.stream()),
                TokenTree::Ident(ident) if banned_identifier(&ident.to_string()) => {
                    self.note(ident.span().start().line, ident.to_string())
                }
                TokenTree::Literal(literal) if literal.to_string().contains(PROC) => {
                    self.note(literal.span().start().line, literal.to_string())
                }
                _ => {}
            }
        }
    }
}

/// A `#[path = "…"]` attribute's value.
fn path_attribute(attrs: &[Attribute]) -> Option<String> {
    attrs.iter().filter(|a| a.path().is_ident("path")).find_map(|a| match &a.meta {
        Meta::NameValue(syn::MetaNameValue {
            value: Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(s), .. }), ..
        }) => Some(s.value()),
        _ => None,
    })
}

/// The attributes of the expressions a `cfg` may stand on (as statements).
fn expr_attrs(expr: &Expr) -> &[Attribute] {
    match expr {
        Expr::Block(e) => &e.attrs,
        Expr::Unsafe(e) => &e.attrs,
        Expr::Call(e) => &e.attrs,
        Expr::MethodCall(e) => &e.attrs,
        Expr::Macro(e) => &e.attrs,
        Expr::If(e) => &e.attrs,
        Expr::Match(e) => &e.attrs,
        Expr::Assign(e) => &e.attrs,
        Expr::Return(e) => &e.attrs,
        Expr::Path(e) => &e.attrs,
        _ => &[],
    }
}

impl<'ast> Visit<'ast> for Reader {
    // Attributes (doc comments among them) say things about code; they call nothing.
    fn visit_attribute(&mut self, _: &'ast Attribute) {}

    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs: &[Attribute] = match item {
            syn::Item::Const(i) => &i.attrs,
            syn::Item::Enum(i) => &i.attrs,
            syn::Item::ExternCrate(i) => &i.attrs,
            syn::Item::Fn(i) => &i.attrs,
            syn::Item::ForeignMod(i) => &i.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Macro(i) => &i.attrs,
            syn::Item::Mod(i) => &i.attrs,
            syn::Item::Static(i) => &i.attrs,
            syn::Item::Struct(i) => &i.attrs,
            syn::Item::Trait(i) => &i.attrs,
            syn::Item::TraitAlias(i) => &i.attrs,
            syn::Item::Type(i) => &i.attrs,
            syn::Item::Union(i) => &i.attrs,
            syn::Item::Use(i) => &i.attrs,
            _ => &[],
        };
        self.within(attrs, |me| {
            if let syn::Item::Mod(module) = item
                && module.content.is_none()
            {
                let (name, path) = (module.ident.to_string(), path_attribute(&module.attrs));
                me.modules.push(Module { name, path, linux_only: me.gated });
            }
            visit::visit_item(me, item);
        });
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        let attrs: &[Attribute] = match item {
            syn::ImplItem::Const(i) => &i.attrs,
            syn::ImplItem::Fn(i) => &i.attrs,
            syn::ImplItem::Type(i) => &i.attrs,
            syn::ImplItem::Macro(i) => &i.attrs,
            _ => &[],
        };
        self.within(attrs, |me| visit::visit_impl_item(me, item));
    }

    fn visit_trait_item(&mut self, item: &'ast syn::TraitItem) {
        let attrs: &[Attribute] = match item {
            syn::TraitItem::Const(i) => &i.attrs,
            syn::TraitItem::Fn(i) => &i.attrs,
            syn::TraitItem::Type(i) => &i.attrs,
            syn::TraitItem::Macro(i) => &i.attrs,
            _ => &[],
        };
        self.within(attrs, |me| visit::visit_trait_item(me, item));
    }

    fn visit_stmt(&mut self, stmt: &'ast syn::Stmt) {
        let attrs: &[Attribute] = match stmt {
            syn::Stmt::Local(local) => &local.attrs,
            syn::Stmt::Macro(mac) => &mac.attrs,
            syn::Stmt::Expr(expr, _) => expr_attrs(expr),
            // Items have their own visit.
            syn::Stmt::Item(_) => &[],
        };
        self.within(attrs, |me| visit::visit_stmt(me, stmt));
    }

    fn visit_arm(&mut self, arm: &'ast syn::Arm) {
        self.within(&arm.attrs, |me| visit::visit_arm(me, arm));
    }

    fn visit_field(&mut self, field: &'ast syn::Field) {
        self.within(&field.attrs, |me| visit::visit_field(me, field));
    }

    fn visit_field_value(&mut self, field: &'ast syn::FieldValue) {
        self.within(&field.attrs, |me| visit::visit_field_value(me, field));
    }

    fn visit_variant(&mut self, variant: &'ast syn::Variant) {
        self.within(&variant.attrs, |me| visit::visit_variant(me, variant));
    }

    fn visit_ident(&mut self, ident: &'ast proc_macro2::Ident) {
        if banned_identifier(&ident.to_string()) {
            self.note(ident.span().start().line, ident.to_string());
        }
    }

    fn visit_lit_str(&mut self, lit: &'ast syn::LitStr) {
        if lit.value().contains(PROC) {
            self.note(lit.span().start().line, format!("{:?}", lit.value()));
        }
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        visit::visit_path(self, &mac.path);
        self.tokens(mac.tokens.clone());
    }
}

/// Reads one file; `linux_only` when it is declared for Linux alone.
fn read(text: &str, linux_only_file: bool) -> Result<Reader, syn::Error> {
    let file = syn::parse_file(text)?;
    let mut reader = Reader { gated: linux_only_file || linux_only(&file.attrs), ..Reader::default() };
    reader.visit_file(&file);
    Ok(reader)
}

/// A source file to read, as the compiler reaches it.
struct Source {
    path: PathBuf,
    /// Holds its modules beside it (a crate root, a `mod.rs`, a file named by `#[path]`), rather
    /// than in a folder of its own name.
    mod_rs: bool,
    linux_only: bool,
}

/// Where `module`, declared in `parent`, lives, as the compiler looks for it.
fn module_source(parent: &Source, module: &Module) -> Source {
    let dir = parent.path.parent().expect("a source file's directory");
    let linux_only = parent.linux_only || module.linux_only;
    if let Some(path) = &module.path {
        return Source { path: dir.join(path), mod_rs: true, linux_only };
    }
    let base = match parent.path.file_stem() {
        Some(stem) if !parent.mod_rs => dir.join(stem),
        _ => dir.to_path_buf(),
    };
    let flat = base.join(format!("{}.rs", module.name));
    if flat.exists() {
        Source { path: flat, mod_rs: false, linux_only }
    } else {
        Source { path: base.join(&module.name).join("mod.rs"), mod_rs: true, linux_only }
    }
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace").to_path_buf()
}

/// The workspace's crates.
const MEMBERS: [&str; 5] = ["proto", "agent", "server", "agent-bridge", "tests"];

/// Every crate root of the workspace: libraries, binaries, build scripts and test targets.
fn roots() -> Vec<PathBuf> {
    let ws = workspace();
    let mut roots = Vec::new();
    for member in MEMBERS {
        let dir = ws.join(member);
        for root in ["src/lib.rs", "src/main.rs", "build.rs"] {
            if dir.join(root).exists() {
                roots.push(dir.join(root));
            }
        }
        for entry in std::fs::read_dir(dir.join("src/bin")).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "rs") {
                roots.push(path);
            } else if path.join("main.rs").exists() {
                roots.push(path.join("main.rs"));
            }
        }
    }
    // The test targets of the tests crate, as its Cargo.toml names them.
    let manifest: toml::Table = toml::from_str(&std::fs::read_to_string(ws.join("tests/Cargo.toml")).unwrap()).unwrap();
    for target in manifest["test"].as_array().expect("[[test]] targets") {
        roots.push(ws.join("tests").join(target["path"].as_str().unwrap()));
    }
    roots
}

/// Every Rust file under the workspace's crates.
fn every_source_file() -> std::collections::BTreeSet<PathBuf> {
    fn walk(dir: &Path, out: &mut std::collections::BTreeSet<PathBuf>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() && entry.file_name() != "target" && entry.file_name() != "node_modules" {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.insert(path);
            }
        }
    }
    let mut files = std::collections::BTreeSet::new();
    for member in MEMBERS {
        walk(&workspace().join(member), &mut files);
    }
    files
}

#[test]
fn no_linux_only_api_is_used_outside_code_compiled_for_linux_alone() {
    let mut findings = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    let mut queue: Vec<Source> =
        roots().into_iter().map(|path| Source { path, mod_rs: true, linux_only: false }).collect();
    while let Some(source) = queue.pop() {
        if !seen.insert(source.path.clone()) {
            continue;
        }
        let name = source.path.strip_prefix(workspace()).unwrap_or(&source.path).display().to_string();
        let text = std::fs::read_to_string(&source.path).unwrap_or_else(|e| panic!("read {name}: {e}"));
        let reader = read(&text, source.linux_only).unwrap_or_else(|e| panic!("parse {name}: {e}"));
        findings.extend(reader.findings.iter().map(|Finding { line, what }| format!("{name}:{line}: {what}")));
        queue.extend(reader.modules.iter().map(|module| module_source(&source, module)));
    }
    assert!(
        findings.is_empty(),
        "Linux-only APIs outside code compiled for Linux alone (put them under #[cfg(target_os = \"linux\")] with a portable path beside them):\n{}",
        findings.join("\n")
    );
    // A file no crate declares would escape the check.
    let unread: Vec<_> = every_source_file().difference(&seen).cloned().collect();
    assert!(unread.is_empty(), "files of no crate the check reads: {unread:?}");
}

#[test]
fn the_check_reads_code_as_the_compiler_does() {
    let findings = |text: &str| read(text, false).unwrap().findings.into_iter().map(|f| f.line).collect::<Vec<_>>();
    // Outside any cfg, in a string, a macro's arguments, a path: found, by line.
    let open = "fn alive(pid: u32) -> bool {\n    std::path::Path::new(&format!(\"/proc/{pid}\")).exists()\n}\n\
                fn open(pid: i32) -> i64 {\n    unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) }\n}\n";
    assert_eq!(findings(open), [2, 5]);
    // A comment or a doc comment calls nothing.
    assert!(findings("/// reads /proc/self\n// then pidfd_open\nfn f() {}\n").is_empty());
    // Under a cfg that holds on Linux alone (item, statement, block, arm, impl item): skipped.
    let gated = "#[cfg(target_os = \"linux\")]\nfn a() { std::fs::read(\"/proc/self/stat\"); }\n\
                 fn b() {\n    #[cfg(target_os = \"linux\")]\n    let fd = libc::SYS_pidfd_open;\n\
                 #[cfg(all(unix, target_os = \"linux\"))]\n    { libc::prctl(1); }\n}\n\
                 impl S {\n    #[cfg(not(any(windows, target_os = \"macos\")))]\n    fn c() { epoll(); }\n}\n";
    assert!(findings(gated).is_empty(), "{:?}", findings(gated));
    // A cfg that holds on macOS or Windows too does not confine it.
    for cfg in ["unix", "not(windows)", "any(target_os = \"linux\", target_os = \"macos\")", "feature = \"x\""] {
        let text = format!("#[cfg({cfg})]\nfn a() {{ let _ = \"/proc\"; }}\n");
        assert_eq!(findings(&text), [2], "cfg({cfg})");
    }
    // A file compiled for Linux alone, and the modules it is declared without.
    assert!(findings("#![cfg(target_os = \"linux\")]\nfn a() { inotify_init(); }\n").is_empty());
    let parent =
        read("#[cfg(target_os = \"linux\")]\nmod pg;\nmod mcp;\n#[path = \"x/y.rs\"]\nmod y;\n", false).unwrap();
    let module = |name: &str, path: Option<&str>, linux_only| Module {
        name: name.into(),
        path: path.map(Into::into),
        linux_only,
    };
    assert_eq!(
        parent.modules,
        [module("pg", None, true), module("mcp", None, false), module("y", Some("x/y.rs"), false)]
    );
    // What a Linux-only file declares is Linux's too.
    let source = Source { path: PathBuf::from("/w/tests/src/lib.rs"), mod_rs: true, linux_only: true };
    assert!(module_source(&source, &module("pg", None, false)).linux_only);
    let flat = Source { path: PathBuf::from("/w/server/src/dev.rs"), mod_rs: false, linux_only: false };
    assert_eq!(
        module_source(&flat, &module("postgres", None, false)).path,
        PathBuf::from("/w/server/src/dev/postgres/mod.rs")
    );
    assert_eq!(module_source(&flat, &module("y", Some("y.rs"), false)).path, PathBuf::from("/w/server/src/y.rs"));
}
