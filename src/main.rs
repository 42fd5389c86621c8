//! The `portico` command line.

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use portico::config::{self, Config};
use std::path::PathBuf;
use std::process::ExitCode;

/// The config file read when `-c` is not given and `$PORTICO_CONFIG` is not
/// set, if it exists (where the Debian package installs it).
const DEFAULT_CONFIG: &str = "/etc/portico/portico.toml";

/// Shown at the end of `--help` and in the man page.
const AFTER_HELP: &str = "\
Config file: `-c FILE`; without it, the file named by $PORTICO_CONFIG, else
/etc/portico/portico.toml if it exists, else the embedded defaults (`portico
run --help` says which applies now).

Signals to `portico run`: SIGHUP reloads the config file, SIGUSR1 reopens the
error and access logs (log rotation), SIGTERM or SIGINT drains and exits.

Environment: PORTICO_CONFIG (the default config file); NOTIFY_SOCKET (set by
systemd for Type=notify: Portico sends READY=1 once every listener serves,
RELOADING=1 around a SIGHUP reload and STOPPING=1 when it drains).

Completions: `portico completions bash|zsh|fish`; man page: `portico man`.
See docs/CONFIG.md for every config key.";

#[derive(Parser)]
#[command(
    name = "portico",
    version,
    about = "A caching web proxy server: forward, reverse and transparent",
    after_long_help = AFTER_HELP
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server (on embedded defaults when no config file is given).
    Run {
        /// Config file (TOML).
        #[arg(short, long)]
        config: Option<PathBuf>,
        /// Print the effective configuration, defaults filled in (limits
        /// sized from the machine resolved), and exit.
        #[arg(long)]
        print_config: bool,
        /// Internal: run as worker process I of a multi-process server
        /// (the supervisor starts workers with it).
        #[arg(long, hide = true, value_name = "I")]
        worker: Option<usize>,
    },
    /// Check a config file and exit non-zero if it has an error.
    Check {
        /// Config file (TOML); default: as for `run`.
        #[arg(short, long)]
        config: Option<PathBuf>,
    },
    /// Disk cache maintenance: gc, list, purge, verify (safe while a server runs).
    Cache(portico::cache::admin::CacheArgs),
    /// Print the perfdump and tuning advice of a running server.
    Stats {
        /// Server address (default: the config's first listener, else 127.0.0.1:8080).
        #[arg(long)]
        addr: Option<String>,
        /// Config file, for the listener address and the perfdump path.
        #[arg(short, long)]
        config: Option<PathBuf>,
    },
    /// Routing rules: `rules test` shows which rule a request matches.
    Rules {
        #[command(subcommand)]
        command: RulesCommand,
    },
    /// Print shell completions for bash, zsh or fish (generated from these
    /// definitions), e.g. `portico completions bash > /etc/bash_completion.d/portico`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the man page portico(1) in roff, e.g. `portico man > portico.1`;
    /// with --dir, write portico.1 and a page per subcommand there.
    Man {
        /// Directory to write portico.1 and portico-SUBCOMMAND.1 to.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Access control: `acl test` shows which [[acl]] entry decides a request.
    Acl {
        #[command(subcommand)]
        command: AclCommand,
    },
    /// Proxy arrays: `array owner` shows which member owns a URL by CARP.
    Array {
        #[command(subcommand)]
        command: ArrayCommand,
    },
}

#[derive(Subcommand)]
enum ArrayCommand {
    /// Print the [array] member that owns each URL by CARP, then the
    /// members to fall back to, best first (as the PAC file orders them).
    Owner {
        /// Config file (TOML); default: as for `run`.
        #[arg(short, long)]
        config: Option<PathBuf>,
        /// Print what the PAC file answers for each URL outside its
        /// pac_direct list ("PROXY a:port; PROXY b:port; DIRECT"), one line each.
        #[arg(long)]
        pac: bool,
        /// Absolute URLs, hashed exactly as written; `-` reads one a line from standard input.
        #[arg(required = true)]
        urls: Vec<String>,
    },
}

/// `portico array owner`.
fn array_owner(c: &Config, pac: bool, urls: Vec<String>) -> Result<(), String> {
    let mut all = Vec::new();
    for url in urls {
        if url == "-" {
            let text = std::io::read_to_string(std::io::stdin())
                .map_err(|e| format!("cannot read URLs from standard input: {}", portico::util::io_cause(&e)))?;
            all.extend(text.lines().map(String::from));
        } else {
            all.push(url);
        }
    }
    print!("{}", portico::array::owner_report(c, &all, pac)?);
    Ok(())
}

/// Writes the man pages: portico(1) to standard output, or every page
/// (portico.1, portico-run.1, ...) to `dir`.
fn man(dir: Option<PathBuf>) -> Result<(), String> {
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    let Some(dir) = dir else {
        return clap_mangen::Man::new(cmd)
            .title("PORTICO")
            .render(&mut std::io::stdout())
            .map_err(|e| format!("cannot write the man page: {}", portico::util::io_cause(&e)));
    };
    fn write(cmd: &clap::Command, dir: &std::path::Path) -> Result<(), String> {
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            write(sub, dir)?;
        }
        let name = cmd.get_display_name().unwrap_or_else(|| cmd.get_name()).to_string();
        let path = dir.join(format!("{name}.1"));
        let mut out = Vec::new();
        clap_mangen::Man::new(cmd.clone())
            .title(name.to_uppercase())
            .render(&mut out)
            .and_then(|()| std::fs::write(&path, out))
            .map_err(|e| format!("cannot write {}: {}", path.display(), portico::util::io_cause(&e)))
    }
    write(&cmd, &dir)
}

/// The config file to use when `-c` is not given: `$PORTICO_CONFIG` (which
/// must exist), else [`DEFAULT_CONFIG`] if it exists, else None (the
/// embedded defaults).
fn default_config() -> Result<Option<PathBuf>, String> {
    match std::env::var_os("PORTICO_CONFIG").filter(|p| !p.is_empty()) {
        Some(p) => {
            let p = PathBuf::from(p);
            match std::fs::metadata(&p) {
                Ok(_) => Ok(Some(p)),
                Err(e) => Err(format!(
                    "{} (named by PORTICO_CONFIG): {}",
                    p.display(),
                    portico::util::io_cause(&e)
                )),
            }
        }
        None => Ok(Some(PathBuf::from(DEFAULT_CONFIG)).filter(|p| p.exists())),
    }
}

/// What `-c` means when it is left out, as `--help` says it: the file that
/// would be read now.
fn config_help(default: &Result<Option<PathBuf>, String>) -> String {
    let now = match default {
        Ok(Some(p)) => format!("now {}", p.display()),
        Ok(None) => format!("now the embedded defaults: {DEFAULT_CONFIG} does not exist"),
        Err(e) => format!("now an error: {e}"),
    };
    format!("Config file (TOML). Default: $PORTICO_CONFIG, else {DEFAULT_CONFIG} if it exists ({now})")
}

#[derive(Subcommand)]
enum AclCommand {
    /// Show which [[acl]] entry decides a request, and the verdict.
    Test {
        /// Config file (TOML).
        #[arg(short, long)]
        config: PathBuf,
        /// The request's absolute URL (http://host[:port]/path?query), or a
        /// CONNECT target host:port.
        url: String,
        /// Request method (default: GET for a URL, CONNECT for host:port).
        #[arg(long)]
        method: Option<String>,
        /// Client address.
        #[arg(long, default_value = "127.0.0.1")]
        client: std::net::IpAddr,
        /// The authenticated user (default: none).
        #[arg(long)]
        user: Option<String>,
        /// A group of the user (repeatable).
        #[arg(long = "group", value_name = "GROUP")]
        groups: Vec<String>,
        /// A request header field, 'Name: value' (repeatable).
        #[arg(long = "header", value_name = "NAME: VALUE")]
        headers: Vec<String>,
        /// Listener mode: forward, reverse or transparent (default: the first listener's).
        #[arg(long)]
        mode: Option<String>,
        /// Local time in access.time_zone, YYYY-MM-DDTHH:MM (default: now).
        #[arg(long, value_name = "YYYY-MM-DDTHH:MM")]
        at: Option<String>,
        /// The response's Content-Type, to try the response (content_type) entries too.
        #[arg(long, value_name = "TYPE")]
        content_type: Option<String>,
    },
}

fn acl_test(command: AclCommand) -> Result<(), String> {
    let AclCommand::Test {
        config,
        url,
        method,
        client,
        user,
        groups,
        headers,
        mode,
        at,
        content_type,
    } = command;
    let c = load(Some(&config))?;
    let text = std::fs::read_to_string(&config).unwrap_or_default();
    let probe = portico::acl::Probe {
        // A bare host:port is a CONNECT target, as a browser would send it.
        method: method.unwrap_or_else(|| if url.contains("://") { "GET" } else { "CONNECT" }.to_string()),
        url,
        client,
        user,
        groups,
        headers,
        mode: parse_mode(mode.as_deref())?,
        at,
        content_type,
    };
    let out = portico::acl::explain(&c, &config.display().to_string(), &config::acl_lines(&text), &probe)?;
    print!("{out}");
    Ok(())
}

/// `--mode` of the test commands.
fn parse_mode(mode: Option<&str>) -> Result<Option<config::Mode>, String> {
    match mode {
        None => Ok(None),
        Some("forward") => Ok(Some(config::Mode::Forward)),
        Some("reverse") => Ok(Some(config::Mode::Reverse)),
        Some("transparent") => Ok(Some(config::Mode::Transparent)),
        Some("socks") => Ok(Some(config::Mode::Socks)),
        Some(m) => Err(format!("--mode {m:?}: use forward, reverse, transparent or socks")),
    }
}

#[derive(Subcommand)]
enum RulesCommand {
    /// Show which [[rule]] a request matches and the actions that result.
    Test {
        /// Config file (TOML).
        #[arg(short, long)]
        config: PathBuf,
        /// The request's absolute URL: http://host[:port]/path?query; with
        /// --method CONNECT, the tunnel's host:port (or an https:// URL).
        url: String,
        /// Request method.
        #[arg(long, default_value = "GET")]
        method: String,
        /// Client address.
        #[arg(long, default_value = "127.0.0.1")]
        client: std::net::IpAddr,
        /// A request header field, 'Name: value' (repeatable).
        #[arg(long = "header", value_name = "NAME: VALUE")]
        headers: Vec<String>,
        /// Listener mode: forward, reverse or transparent (default: the first listener's).
        #[arg(long)]
        mode: Option<String>,
    },
}

fn rules_test(command: RulesCommand) -> Result<(), String> {
    let RulesCommand::Test {
        config,
        url,
        method,
        client,
        headers,
        mode,
    } = command;
    let c = load(Some(&config))?;
    let text = std::fs::read_to_string(&config).unwrap_or_default();
    let mode = match mode.as_deref() {
        None => None,
        Some("forward") => Some(config::Mode::Forward),
        Some("reverse") => Some(config::Mode::Reverse),
        Some("transparent") => Some(config::Mode::Transparent),
        Some("socks") => Some(config::Mode::Socks),
        Some(m) => return Err(format!("--mode {m:?}: use forward, reverse, transparent or socks")),
    };
    let probe = portico::rules::Probe {
        url,
        method,
        client,
        headers,
        mode,
    };
    let out = portico::rules::explain(&c, &config.display().to_string(), &config::rule_lines(&text), &probe)?;
    print!("{out}");
    Ok(())
}

fn load(path: Option<&PathBuf>) -> Result<Config, String> {
    match path {
        Some(p) => config::load_file(p).map_err(|e| e.to_string()),
        None => Ok(Config::default()),
    }
}

fn main() -> ExitCode {
    portico::privdrop::tighten_umask();
    let default = default_config();
    // `--help` of each command taking `-c` names the file it would read now.
    let help = config_help(&default);
    let cmd = ["run", "check", "stats", "cache"]
        .iter()
        .fold(Cli::command(), |cmd, name| {
            cmd.mut_subcommand(name, |c| c.mut_arg("config", |a| a.help(help.clone())))
        });
    let cli = match Cli::from_arg_matches(&cmd.get_matches()) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    // `-c` left out: the default file, if any (an error only when
    // PORTICO_CONFIG names a missing file).
    let or_default = |given: Option<PathBuf>| match given {
        Some(p) => Ok(Some(p)),
        None => default.clone(),
    };
    let result = match cli.command {
        Command::Run {
            config,
            print_config,
            worker,
        } => or_default(config).and_then(|config| {
            // A worker reads what its supervisor validated (`config::source`).
            let loaded = match &config {
                Some(p) => config::source::read_at_start(p, worker.is_some())
                    .map(|(c, text)| (c, Some(text)))
                    .map_err(|e| e.to_string()),
                None => Ok((Config::default(), None)),
            };
            loaded.and_then(|(mut c, config_text)| {
                if print_config {
                    let files = portico::sizing::raise_open_files();
                    let said = portico::sizing::resolve(&mut c, files.now);
                    println!("# sizing: {said}");
                    println!("# memory: {}", portico::config::memory::note(&c));
                    print!("{}", c.to_toml());
                    Ok(())
                } else {
                    let opts = portico::server::RunOptions {
                        config_path: config,
                        config_text,
                        worker,
                    };
                    portico::server::run(c, opts)
                }
            })
        }),
        Command::Stats { addr, config } => or_default(config)
            .and_then(|config| load(config.as_ref()))
            .and_then(|c| {
                let addr = addr.unwrap_or_else(|| {
                    c.listener
                        .first()
                        .map_or("127.0.0.1:8080".to_string(), |l| l.address.to_string())
                });
                let path = if c.monitor.perf.is_empty() {
                    "/.perf"
                } else {
                    c.monitor.perf.as_str()
                };
                portico::stats::fetch(&addr, path).map(|text| print!("{text}"))
            }),
        Command::Check { config } => match or_default(config) {
            Ok(Some(config)) => load(Some(&config))
                .and_then(|c| {
                    // The certificates too: `run` would refuse them.
                    portico::tls::check_listeners(&c).map(|()| c)
                })
                .map(|c| {
                    // `run` needs `server.user` and `group` to exist here; the
                    // file itself is valid (it may be meant for another machine).
                    if let Err(e) = portico::privdrop::target(&c) {
                        eprintln!("portico: warning: {e}: `portico run` would fail on this machine");
                    }
                    for w in portico::server::destination_warnings(&c) {
                        eprintln!("portico: warning: {w}");
                    }
                    let read_at_reload = (c.server.processes == 1).then_some(config.as_path());
                    for w in portico::privdrop::unreadable_warnings(&c, read_at_reload) {
                        eprintln!("portico: warning: {w}");
                    }
                    println!("{}: OK", config.display())
                }),
            Ok(None) => Err(format!(
                "no config file to check: give -c FILE ({DEFAULT_CONFIG} does not exist)"
            )),
            Err(e) => Err(e),
        },
        Command::Rules { command } => rules_test(command),
        Command::Acl { command } => acl_test(command),
        Command::Array {
            command: ArrayCommand::Owner { config, pac, urls },
        } => or_default(config)
            .and_then(|config| load(config.as_ref()))
            .and_then(|c| array_owner(&c, pac, urls)),
        Command::Completions { shell } => {
            // From the same definitions as the parser, so they never go stale.
            clap_complete::generate(shell, &mut Cli::command(), "portico", &mut std::io::stdout());
            Ok(())
        }
        Command::Man { dir } => man(dir),
        Command::Cache(mut args) => match or_default(args.config.take()).and_then(|config| {
            args.config = config;
            load(args.config.as_ref())
        }) {
            Err(e) => Err(e),
            Ok(c) => {
                let upstreams = c.upstream.iter().any(|u| !u.parent);
                if let portico::cache::admin::CacheCommand::Purge { url, prefix } = &args.command {
                    // The files are gone; a running server may still hold
                    // the objects in its memory tier, which only it can
                    // clear. Its answer is told apart from the disk's count.
                    portico::cache::admin::purge(&c.cache, upstreams, url.as_deref(), prefix.as_deref()).map(|disk| {
                        if let Some(target) = prefix.as_ref().or(url.as_ref()) {
                            println!(
                                "{}",
                                portico::proxy::purge_running(&c, target, prefix.is_some(), disk.removed)
                            );
                        }
                    })
                } else {
                    match portico::cache::admin::run(&c.cache, upstreams, &args.command) {
                        Ok(true) => Ok(()),
                        Ok(false) => return ExitCode::FAILURE,
                        Err(e) => Err(e),
                    }
                }
            }
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("portico: {e}");
            ExitCode::FAILURE
        }
    }
}
