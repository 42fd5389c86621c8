//! The `portico` command line.

use clap::{Parser, Subcommand};
use portico::config::{self, Config};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "portico",
    version,
    about = "A caching web proxy server: forward, reverse and transparent"
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
        /// Config file (TOML).
        #[arg(short, long)]
        config: PathBuf,
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
    /// Access control: `acl test` shows which [[acl]] entry decides a request.
    Acl {
        #[command(subcommand)]
        command: AclCommand,
    },
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
        Some(m) => Err(format!("--mode {m:?}: use forward, reverse or transparent")),
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
        Some(m) => return Err(format!("--mode {m:?}: use forward, reverse or transparent")),
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
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run {
            config,
            print_config,
            worker,
        } => load(config.as_ref()).and_then(|mut c| {
            if print_config {
                let files = portico::sizing::raise_open_files();
                let said = portico::sizing::resolve(&mut c, files.now);
                println!("# sizing: {said}");
                print!("{}", c.to_toml());
                Ok(())
            } else {
                let opts = portico::server::RunOptions {
                    config_path: config,
                    worker,
                };
                portico::server::run(c, opts)
            }
        }),
        Command::Stats { addr, config } => load(config.as_ref()).and_then(|c| {
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
        Command::Check { config } => load(Some(&config)).map(|_| println!("{}: OK", config.display())),
        Command::Rules { command } => rules_test(command),
        Command::Acl { command } => acl_test(command),
        Command::Cache(args) => match load(args.config.as_ref()) {
            Err(e) => Err(e),
            Ok(c) => match portico::cache::admin::run(&c.cache, c.upstream.iter().any(|u| !u.parent), &args.command) {
                Ok(true) => {
                    // The files are gone; a running server may still hold the
                    // object in its memory tier, which only it can clear.
                    if let portico::cache::admin::CacheCommand::Purge { url, prefix } = &args.command
                        && let Some(target) = prefix.as_ref().or(url.as_ref())
                    {
                        println!("{}", portico::proxy::purge_running(&c, target, prefix.is_some()));
                    }
                    Ok(())
                }
                Ok(false) => return ExitCode::FAILURE,
                Err(e) => Err(e),
            },
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
