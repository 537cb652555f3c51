use std::path::PathBuf;

use super::error_of;
use crate::spec::{CniError, Command, Environment};

const CONTAINER_ID: &str = "3f6940ab5ab43bc522569d15b23f8c1b";

/// A complete, valid environment for `command`; tests remove or replace one variable.
fn full_env(command: &str) -> Vec<(String, String)> {
    [
        ("CNI_COMMAND", command),
        ("CNI_CONTAINERID", CONTAINER_ID),
        ("CNI_NETNS", "/var/run/netns/pod-1"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_ARGS", "IgnoreUnknown=1;K8S_POD_NAME=web-0"),
        ("CNI_PATH", "/opt/cni/bin:/usr/lib/cni"),
        ("HOME", "/root"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

fn without(command: &str, var: &str) -> Vec<(String, String)> {
    full_env(command)
        .into_iter()
        .filter(|(k, _)| k != var)
        .collect()
}

fn with(command: &str, var: &str, value: &str) -> Vec<(String, String)> {
    let mut vars = without(command, var);
    vars.push((var.to_owned(), value.to_owned()));
    vars
}

#[track_caller]
fn assert_env_error(outcome: Result<Environment, CniError>, var: &str) {
    let err = error_of(outcome);
    assert_eq!(err.code.code(), 4, "{err}");
    assert!(
        err.msg.contains(var),
        "message should name {var}: {}",
        err.msg
    );
}

#[test]
fn add_environment_is_parsed_in_full() {
    let env = Environment::from_vars(full_env("ADD")).expect("valid ADD environment");
    assert_eq!(env.command, Command::Add);
    assert_eq!(env.container_id.as_deref(), Some(CONTAINER_ID));
    assert_eq!(env.netns, Some(PathBuf::from("/var/run/netns/pod-1")));
    assert_eq!(env.ifname.as_deref(), Some("eth0"));
    assert_eq!(env.args.get("K8S_POD_NAME"), Some("web-0"));
    assert_eq!(
        env.path,
        [PathBuf::from("/opt/cni/bin"), PathBuf::from("/usr/lib/cni")]
    );
}

#[test]
fn every_command_parses_from_its_exact_name() {
    for command in Command::ALL {
        let env = Environment::from_vars(full_env(command.as_str())).expect("valid environment");
        assert_eq!(env.command, command);
    }
}

#[test]
fn each_required_variable_missing_or_empty_is_code_4_naming_it() {
    let required: [(&str, &[&str]); 5] = [
        (
            "ADD",
            &["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"],
        ),
        (
            "CHECK",
            &["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"],
        ),
        ("DEL", &["CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH"]),
        ("STATUS", &["CNI_PATH"]),
        ("GC", &["CNI_PATH"]),
    ];
    for (command, vars) in required {
        for var in vars {
            assert_env_error(Environment::from_vars(without(command, var)), var);
            assert_env_error(Environment::from_vars(with(command, var, "")), var);
        }
    }
}

#[test]
fn missing_command_is_code_4_naming_cni_command() {
    assert_env_error(
        Environment::from_vars(without("ADD", "CNI_COMMAND")),
        "CNI_COMMAND",
    );
}

#[test]
fn unknown_or_lower_case_command_is_code_4_naming_cni_command() {
    for command in ["add", "DELETE", "INIT", "FINALIZE", " ADD"] {
        assert_env_error(Environment::from_vars(full_env(command)), "CNI_COMMAND");
    }
}

#[test]
fn del_without_netns_is_accepted_as_none() {
    for vars in [without("DEL", "CNI_NETNS"), with("DEL", "CNI_NETNS", "")] {
        let env = Environment::from_vars(vars).expect("DEL without netns is valid");
        assert_eq!(env.netns, None);
        assert_eq!(env.container_id.as_deref(), Some(CONTAINER_ID));
    }
}

#[test]
fn version_needs_only_the_command() {
    let vars = vec![("CNI_COMMAND".to_owned(), "VERSION".to_owned())];
    let env = Environment::from_vars(vars).expect("VERSION needs nothing else");
    assert_eq!(env.command, Command::Version);
    assert!(env.path.is_empty() && env.container_id.is_none());
}

#[test]
fn version_ignores_invalid_other_variables() {
    let mut vars = with("VERSION", "CNI_IFNAME", "a/b");
    vars.push(("CNI_ARGS".to_owned(), "broken".to_owned()));
    Environment::from_vars(vars).expect("VERSION must answer whatever else is set");
}

#[test]
fn status_and_gc_ignore_attachment_variables() {
    for command in ["STATUS", "GC"] {
        let mut vars = vec![
            ("CNI_COMMAND".to_owned(), command.to_owned()),
            ("CNI_PATH".to_owned(), "/opt/cni/bin".to_owned()),
        ];
        let env = Environment::from_vars(vars.clone()).expect("only CNI_PATH is needed");
        assert_eq!(env.container_id, None);
        vars.push(("CNI_ARGS".to_owned(), "broken".to_owned()));
        Environment::from_vars(vars).expect("CNI_ARGS is not read for network-wide commands");
    }
}

#[test]
fn bad_container_ids_are_code_4_naming_cni_containerid() {
    for id in [
        "-abc",
        "_abc",
        ".abc",
        "abc/def",
        "abc def",
        "abc:1",
        "ünïcode",
        "abc\n",
    ] {
        assert_env_error(
            Environment::from_vars(with("ADD", "CNI_CONTAINERID", id)),
            "CNI_CONTAINERID",
        );
    }
}

#[test]
fn container_ids_of_the_spec_shape_are_accepted() {
    for id in ["a", "0", "abc_DEF.1-2", "k8s_POD_web-0_default_1f2e_0"] {
        Environment::from_vars(with("ADD", "CNI_CONTAINERID", id)).expect("valid container id");
    }
}

#[test]
fn bad_ifnames_are_code_4_naming_cni_ifname() {
    let sixteen = "a".repeat(16);
    for name in [
        sixteen.as_str(),
        ".",
        "..",
        "eth/0",
        "eth:0",
        "eth 0",
        "eth\t0",
        "ëëëëëëëë",
    ] {
        assert_env_error(
            Environment::from_vars(with("ADD", "CNI_IFNAME", name)),
            "CNI_IFNAME",
        );
    }
}

#[test]
fn ifnames_up_to_fifteen_bytes_are_accepted() {
    let fifteen = "a".repeat(15);
    for name in ["e", "eth0", "net1.100", fifteen.as_str(), "..."] {
        let env = Environment::from_vars(with("ADD", "CNI_IFNAME", name)).expect("valid ifname");
        assert_eq!(env.ifname.as_deref(), Some(name));
    }
}

#[test]
fn cni_path_skips_empty_entries_and_refuses_relative_ones() {
    let env = Environment::from_vars(with("ADD", "CNI_PATH", "/a::/b:")).expect("valid path");
    assert_eq!(env.path, [PathBuf::from("/a"), PathBuf::from("/b")]);
    assert_env_error(
        Environment::from_vars(with("ADD", "CNI_PATH", "/a:bin")),
        "CNI_PATH",
    );
    assert_env_error(
        Environment::from_vars(with("GC", "CNI_PATH", ":::")),
        "CNI_PATH",
    );
}

#[test]
fn relative_netns_is_code_4_naming_cni_netns() {
    assert_env_error(
        Environment::from_vars(with("ADD", "CNI_NETNS", "netns/pod-1")),
        "CNI_NETNS",
    );
}

#[test]
fn malformed_cni_args_is_code_4_naming_cni_args_on_add() {
    assert_env_error(
        Environment::from_vars(with("ADD", "CNI_ARGS", "A=1;B")),
        "CNI_ARGS",
    );
}

#[test]
fn malformed_cni_args_is_set_aside_by_del_and_check_which_do_not_use_it() {
    for command in ["DEL", "CHECK"] {
        let env = Environment::from_vars(with(command, "CNI_ARGS", "A=1;B"))
            .unwrap_or_else(|err| panic!("{command} must not fail on CNI_ARGS: {err:?}"));
        assert!(env.args.pairs().is_empty(), "{command}: read as no args");
        let why = env.unreadable_args.expect("kept for the log").to_string();
        assert!(why.contains("CNI_ARGS"), "{command}: {why}");
    }
}

#[test]
fn missing_cni_args_is_no_args() {
    let env = Environment::from_vars(without("ADD", "CNI_ARGS")).expect("CNI_ARGS is optional");
    assert!(env.args.pairs().is_empty());
}
