//! What tests and the benchmark tools read of processes and of the machine in /proc.

/// utime+stime of a process, in clock ticks.
pub fn cpu_ticks(pid: u32) -> Result<u64, String> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).map_err(|e| format!("{path} unreadable: {e}"))?;
    let parse = || -> Option<u64> {
        // Fields after the command name, which is in parentheses and may hold spaces: state is field 3.
        let rest = &stat[stat.rfind(')')? + 2..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let utime: u64 = fields.get(14 - 3)?.parse().ok()?;
        let stime: u64 = fields.get(15 - 3)?.parse().ok()?;
        Some(utime + stime)
    };
    parse().ok_or_else(|| format!("{path}: no utime/stime"))
}

/// A /proc/PID/status field in KiB (`VmRSS:`, `VmHWM:`, `RssAnon:`).
pub fn status_kib(pid: u32, key: &str) -> Result<u64, String> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).map_err(|e| format!("{path} unreadable: {e}"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| format!("{path}: no {key}"))
}

/// Clock ticks the whole machine has spent busy (user, nice, system, iowait, irq, softirq, steal).
pub fn machine_busy_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal
    Some([0, 1, 2, 5, 6, 7].iter().filter_map(|&i| v.get(i)).sum())
}

/// The soft limit of open files of this process (a server it starts inherits it).
pub fn open_files_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// Open file descriptors of a process; unreadable (no /proc, the process gone) is an error, never 0.
pub fn open_fds(pid: u32) -> Result<usize, String> {
    let dir = format!("/proc/{pid}/fd");
    Ok(std::fs::read_dir(&dir)
        .map_err(|e| format!("{dir} unreadable: {e}"))?
        .count())
}
