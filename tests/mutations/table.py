"""Mutations of the daemon's safety lines, each with the tests that must catch it.

Every entry breaks one line the README's guarantees rest on; ``make mutate``
(tests/mutations/run.py) applies each to a copy of the tree, runs only its
tests there, and fails listing every mutation those tests let survive. An
entry names the function its line is in, and its text need only be unique
there (tests/mutations/test_table.py checks every entry still applies).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutation:
    name: str
    file: str
    old: str  # must occur exactly once in the file
    new: str
    tests: tuple[str, ...]  # pytest node ids or paths, run in the mutated copy
    # Further (old, new) replacements anywhere in the same file.
    more: tuple[tuple[str, str], ...] = ()
    # The function (or Class.method) the line lives in: ``old`` need only be
    # unique there, and a line that moves within the file still finds it.
    function: str = ""


MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "frame deadline becomes a per-recv timeout",
        "wcached/protocol/wire.py",
        "            self.sock.settimeout(deadline.remaining())\n            try:\n"
        "                k = self.sock.recv_into",
        "            self.sock.settimeout(None if deadline.at is None else 1.0)\n            try:\n"
        "                k = self.sock.recv_into",
        ("tests/daemon/test_fuzz.py::test_silent_and_dripping_connections_are_dropped_by_the_daemon",),
        function="Channel._recv_exact",
    ),
    Mutation(
        "no hello deadline",
        "wcached/daemon/server.py",
        "hello = chan.recv(MAX_REQUEST_BYTES, idle_timeout=timeout, frame_timeout=timeout)",
        "hello = chan.recv(MAX_REQUEST_BYTES, idle_timeout=None, frame_timeout=None)",
        (
            "tests/daemon/test_fuzz.py::test_silent_and_dripping_connections_are_dropped_by_the_daemon",
            "tests/daemon/test_service.py::test_concurrent_good_client_unaffected_by_bad_ones",
        ),
        function="Server._converse",
    ),
    Mutation(
        "READY before bind",
        "wcached/daemon/service.py",
        "            self.server.bind()\n",
        "            self.notifier.ready(self._status_line())\n            self.server.bind()\n",
        ("tests/daemon/test_guarantees.py::test_ready_is_sent_only_after_the_socket_accepts",),
        more=(
            (
                "            self.notifier.ready(self._status_line())\n            self._loop",
                "            self._loop",
            ),
        ),
        function="Service.run",
    ),
    Mutation(
        "client does not check seals",
        "wcached/memory/host.py",
        "            check_sealed(fd, info.nbytes)\n",
        "",
        ("tests/daemon/test_guarantees.py::test_client_refuses_an_unsealed_memfd_from_a_fake_daemon",),
        function="HostBackend.map_segments",
    ),
    Mutation(
        "supplementary groups ignored",
        "wcached/daemon/peers.py",
        "return peer.gid in self.gids or bool(peer.groups & self.gids)",
        "return peer.gid in self.gids",
        ("tests/daemon/test_peers.py::test_peer_allowed_only_through_a_supplementary_group",),
        function="AccessPolicy.allows",
    ),
    Mutation(
        "extra. key fields off by one",
        "wcached/keys.py",
        "            have: Any = held.extra.get(name[6:])",
        "            have: Any = held.extra.get(name[5:])",
        ("tests/daemon/test_guarantees.py::test_extra_key_fields_are_matched_by_their_exact_names",),
        function="mismatched_fields",
    ),
    Mutation(
        "unknown key field guard loosened",
        "wcached/keys.py",
        'not (k.startswith("extra.") and len(k) > 6)',
        'not k.startswith("extra")',
        ("tests/daemon/test_guarantees.py::test_extra_key_fields_are_matched_by_their_exact_names",),
        function="mismatched_fields",
    ),
    Mutation(
        "malformed frame after hello ends the connection",
        "wcached/daemon/server.py",
        "                    chan.send(self._error_reply(e.code, str(e)), timeout=timeout)\n"
        "                    continue",
        "                    raise",
        (
            "tests/daemon/test_guarantees.py::test_malformed_frame_after_hello_gets_an_error_and_the_connection_goes_on",
        ),
        function="Server._converse",
    ),
    Mutation(
        "request limit raised to 1 MiB",
        "wcached/protocol/wire.py",
        "MAX_REQUEST_BYTES = 64 * 1024",
        "MAX_REQUEST_BYTES = 1024 * 1024",
        (
            "tests/daemon/test_guarantees.py::test_request_of_exactly_the_limit_is_read_one_byte_more_is_refused",
        ),
    ),
    Mutation(
        "no max_clients cap",
        "wcached/daemon/server.py",
        "full = self._threads >= self.settings.max_clients",
        "full = False",
        ("tests/daemon/test_load.py::test_max_clients_plus_one_is_busy_then_served_once_one_leaves",),
        function="Server.accept_pending",
    ),
    Mutation(
        "accepts spin when out of fds",
        "wcached/daemon/server.py",
        "                    self._starved = True\n                    return False",
        "                    self._starved = True\n                    return True",
        ("tests/daemon/test_load.py::test_out_of_fds_pauses_accepting_instead_of_spinning",),
        function="Server.accept_pending",
    ),
    Mutation(
        "socket directory anyone can write is accepted",
        "wcached/daemon/service.py",
        "    if wrong:\n        raise ConfigError(",
        "    if False:\n        raise ConfigError(",
        ("tests/daemon/test_service.py::test_socket_dir_others_could_write_is_refused",),
        function="check_socket_dir",
    ),
    Mutation(
        "client trusts any daemon user",
        "wcached/client/connection.py",
        "    if uid not in trusted_daemon_uids(users):",
        "    if False:",
        ("tests/client/test_connection.py::test_socket_served_by_an_untrusted_user_is_refused",),
        function="check_daemon_peer",
    ),
    Mutation(
        "restore ignores checkpoint stamps",
        "wcached/daemon/provenance.py",
        "        return _stamps_differ(self.checkpoint, now.checkpoint, now.model.path)",
        "        return None",
        (
            "tests/daemon/test_restore.py::test_modified_checkpoint_is_refilled_naming_the_file",
            "tests/daemon/test_restore.py::test_replaced_checkpoint_file_is_refilled",
        ),
        function="Provenance.stale_reason",
    ),
    Mutation(
        "restore ignores changed settings",
        "wcached/daemon/provenance.py",
        "        if changed:\n            return",
        "        if False:\n            return",
        ("tests/daemon/test_restore.py::test_changed_model_settings_are_refilled_naming_them",),
        function="Provenance.stale_reason",
    ),
    Mutation(
        "nothing restored from the store",
        "wcached/daemon/service.py",
        "        stored = listen_fds()\n",
        "        stored = listen_fds() and []\n",
        ("tests/daemon/test_restore.py::test_restart_restores_without_reading_the_checkpoint",),
        function="Service.run",
    ),
    Mutation(
        "leases are not taken up again after a restart",
        "wcached/client/attach.py",
        "            attachment.watch = LeaseWatch(attachment, dict(expect or {}), client)",
        "            pass",
        ("tests/daemon/test_restore.py::test_restart_restores_without_reading_the_checkpoint",),
        function="attach",
    ),
    Mutation(
        "fingerprint blind to rewrites",
        "wcached/loaders/checkpoint.py",
        'h.update(struct.pack("<QQQQQ", len(name), cf.size, cf.ino, cf.mtime_ns, len(cf.header)))',
        'h.update(struct.pack("<QQQQQ", len(name), cf.size, 0, 0, len(cf.header)))',
        (
            "tests/loaders/test_safetensors.py::test_header_fingerprint_sees_rewrites_content_fingerprint_sees_bytes",
        ),
        function="header_fingerprint",
    ),
    Mutation(
        "verify does not compare the checkpoint",
        "wcached/cli/verify.py",
        "            if h.hexdigest() != info.digest:",
        "            if False:",
        ("tests/cli/test_verify.py::test_verify_passes_then_names_a_tensor_rewritten_in_place",),
        function="_compare_disk",
    ),
    Mutation(
        "a released model answers by its key",
        "wcached/daemon/server.py",
        "            held.check_served()\n",
        "",
        ("tests/daemon/test_service.py::test_status_and_release",),
        function="Server._attach",
    ),
    Mutation(
        "no second greeting at protocol version 1",
        "wcached/client/connection.py",
        "                version = 1\n",
        "                raise\n",
        ("tests/client/test_connection.py::test_a_version_1_daemon_is_greeted_again_at_version_1",),
        function="DaemonConnection.__init__",
    ),
    Mutation(
        "bind takes a tensor of another shape",
        "wcached/integrations/vllm_bind.py",
        "    if placeholder.shape != obj.shape or placeholder.dtype != obj.dtype:",
        "    if False:",
        (
            "tests/integrations/test_vllm_fallback.py::"
            "test_a_corrupted_manifest_shape_is_refused_at_bind_naming_the_tensor[0.32]",
        ),
        function="_check_like",
    ),
    Mutation(
        "a daemon-side failure is raised despite fallback",
        "wcached/integrations/vllm_bind.py",
        "            if not self.options.fallback:\n                raise\n            # The model built",
        "            if True:\n                raise\n            # The model built",
        (
            "tests/integrations/test_vllm_fallback.py::test_every_failure_loads_from_disk_and_says_why_once[0.32-busy]",
        ),
        function="WcacheLoading.load_model",
    ),
    Mutation(
        "metrics endpoint on every address",
        "wcached/daemon/metrics.py",
        '    ADDRESS = "127.0.0.1"',
        '    ADDRESS = "0.0.0.0"',
        ("tests/daemon/test_metrics.py::test_endpoint_listens_on_loopback_only",),
        function="MetricsEndpoint",
    ),
    Mutation(
        "a client-chosen model name becomes a metric label",
        "wcached/daemon/metrics.py",
        "            model if model in self._models else UNKNOWN_MODEL,",
        "            model,",
        ("tests/daemon/test_metrics.py::test_textfile_and_endpoint_count_what_clients_did",),
        function="Metrics.count_attach",
    ),
    Mutation(
        "a status query counts as a lease",
        "wcached/daemon/server.py",
        "            return sum(1 for s in self._sessions.values() if s.models)",
        "            return len(self._sessions)",
        ("tests/daemon/test_service.py::test_a_status_query_is_not_a_lease_in_the_units_status",),
        function="Server.client_count",
    ),
    Mutation(
        "models reach the store only once the whole instance has filled",
        "wcached/daemon/filler.py",
        "                on_filled(HeldModel(m, fds, msg.fill_seconds))",
        "                filled_now.append(HeldModel(m, fds, msg.fill_seconds))",
        (
            "tests/daemon/test_restore.py::test_a_model_is_kept_as_it_fills_so_a_later_failure_costs_only_that_model",
        ),
        more=(
            ("        done = 0\n", "        done = 0\n        filled_now: list[HeldModel] = []\n"),
            (
                "            elif isinstance(msg, FillDone):\n                break",
                "            elif isinstance(msg, FillDone):\n                for h in filled_now:\n"
                "                    on_filled(h)\n                break",
            ),
        ),
        function="_fill_in_one_worker",
    ),
    Mutation(
        "an absent checkpoint drops its stored fill",
        "wcached/daemon/holdings.py",
        '            self.store.adopt(name, entry.names)\n            self._move(slot, "away"',
        '            self.store.remove(entry.names)\n            self._move(slot, "away"',
        (
            "tests/daemon/test_holdings.py::test_an_absent_checkpoint_is_away_not_changed",
            "tests/daemon/test_restore.py::test_an_absent_checkpoint_keeps_its_stored_fill_until_it_is_back",
        ),
        function="Holdings._restore_one",
    ),
    Mutation(
        "the fd store's budget is not checked",
        "wcached/daemon/fdstore.py",
        "        if need > free:",
        "        if False:",
        (
            "tests/daemon/test_holdings.py::test_a_model_over_the_budget_is_held_not_stored",
            "tests/daemon/test_restore.py::test_a_model_over_the_store_budget_is_served_and_not_stored",
        ),
        function="FdStore.store",
    ),
    Mutation(
        "check-config ignores the fd store's budget",
        "wcached/cli/check_config.py",
        "    found += _store_budget(cfg)\n",
        "",
        ("tests/cli/test_cli.py::test_check_config_refuses_a_segment_size_the_fd_store_cannot_keep",),
        function="problems",
    ),
    Mutation(
        "a status line waits behind a full notify queue",
        "wcached/daemon/systemd.py",
        "        if not wait:\n            return self._send(payload, anc, fields) is True",
        "        if False:\n            return self._send(payload, anc, fields) is True",
        ("tests/daemon/test_systemd.py::test_status_never_waits_and_store_messages_are_never_dropped",),
        function="Notifier.notify",
    ),
    Mutation(
        "the watchdog is fed whether or not the socket answers",
        "wcached/daemon/service.py",
        "            if probe is not None and probe.healthy() and self.notifier.watchdog_due():",
        "            if self.notifier.watchdog_due():",
        ("tests/daemon/test_systemd.py::test_the_watchdog_is_fed_only_while_the_socket_answers",),
        function="Service._loop",
    ),
    Mutation(
        "a respelled size counts as a changed setting",
        "wcached/config.py",
        "            models.append(model.parsed())",
        "            models.append(model)",
        ("tests/daemon/test_restore.py::test_a_respelled_segment_size_restores",),
        function="_parse_models",
    ),
    Mutation(
        "a lease watch gives up on a daemon that times out while coming back",
        "wcached/client/lease.py",
        "    return isinstance(e, (OSError, DaemonUnavailable, TimeoutExpired, ProtocolError, Busy))",
        "    return isinstance(e, (OSError, DaemonUnavailable, Busy))",
        ("tests/client/test_lease.py::test_a_daemon_that_times_out_while_coming_back_is_waited_for",),
        function="_transient",
    ),
    Mutation(
        "a worker killed mid-fill is called a corrupt checkpoint",
        "wcached/daemon/filler.py",
        '        return WorkerDied(f"loader worker was killed by {name}{hint}")',
        '        return error_for_code("checkpoint_corrupt", f"loader worker was killed by {name}{hint}")',
        ("tests/daemon/test_service.py::test_a_worker_killed_mid_fill_is_retried_not_called_corrupt",),
        function="_worker_death",
    ),
    Mutation(
        "an unclassified error exits with a bare 1",
        "wcached/errors.py",
        '    code = "internal"\n    exit_status = EX_SOFTWARE',
        '    code = "internal"\n    exit_status = 1',
        ("tests/test_exits.py",),
        function="WcacheError",
    ),
    Mutation(
        "a GPU not ready yet fails for good",
        "wcached/errors.py",
        '    code = "device_not_ready"\n    exit_status = EX_UNAVAILABLE',
        '    code = "device_not_ready"\n    exit_status = EX_CONFIG',
        ("tests/test_device.py::test_nvml_not_ready_is_retried_an_absent_gpu_is_not",),
        function="DeviceNotReady",
    ),
    Mutation(
        "the unit retries a corrupt checkpoint",
        "packaging/systemd/wcached@.service",
        "RestartPreventExitStatus=78 65",
        "RestartPreventExitStatus=78",
        ("tests/test_exits.py::test_the_unit_retries_exactly_the_retried_statuses",),
    ),
    Mutation(
        "a tensor cast at fill is read whole with one call",
        "wcached/loaders/checkpoint.py",
        "        got = preadv_full(fd, [buf[:want]], t.data_start + done)",
        "        got = os.preadv(fd, [buf[:want]], t.data_start + done)",
        ("tests/cli/test_verify.py::test_tensors_over_2_gib_fill_cast_and_verify",),
        more=(("READ_CHUNK = 64 << 20", "READ_CHUNK = 1 << 40"),),
        function="read_pieces",
    ),
    Mutation(
        "the daemon's own liveness probe is refused when every slot is a lease",
        "wcached/daemon/server.py",
        "            if full and self._is_own_probe(conn):",
        "            if False:",
        ("tests/daemon/test_systemd.py::test_the_liveness_probe_is_served_when_every_slot_is_a_lease",),
        function="Server.accept_pending",
    ),
    Mutation(
        "the lease watcher uses select()",
        "wcached/client/lease.py",
        "        sel = selectors.DefaultSelector()",
        "        sel = selectors.SelectSelector()",
        ("tests/client/test_lease.py::test_a_lease_on_a_socket_numbered_over_1024_is_followed",),
        function="_Watcher._run",
    ),
    Mutation(
        "a dropped watchdog ping is not sent again until the next interval",
        "wcached/daemon/systemd.py",
        '        if self.notify("WATCHDOG=1"):\n            self._last_ping = time.monotonic()',
        '        self._last_ping = time.monotonic()\n        self.notify("WATCHDOG=1")',
        ("tests/daemon/test_systemd.py::test_a_ping_a_full_queue_dropped_stays_due",),
        function="Notifier.ping_watchdog",
    ),
    Mutation(
        "a name stored twice is served",
        "wcached/daemon/holdings.py",
        "        if entry.duplicated:\n",
        "        if False:\n",
        ("tests/daemon/test_holdings.py::test_a_name_stored_twice_is_served_from_neither",),
        function="Holdings._held_from",
    ),
    Mutation(
        "an instance table that names no instance is ignored",
        "wcached/config.py",
        "        if not is_instance_name(name):",
        "        if False:",
        ("tests/test_config.py::test_mistakes_name_file_and_key",),
        function="_check",
    ),
    Mutation(
        "of two tables naming one device, the first silently wins",
        "wcached/config.py",
        "    if len(matching) > 1:",
        "    if False:",
        ("tests/test_config.py::test_two_tables_naming_one_device_are_a_config_error",),
        function="instance_settings",
    ),
    Mutation(
        "received fds are inheritable",
        "wcached/protocol/wire.py",
        "socket.CMSG_SPACE(want * 4), socket.MSG_CMSG_CLOEXEC)",
        "socket.CMSG_SPACE(want * 4))",
        ("tests/protocol/test_wire.py::test_more_fds_than_one_scm_rights_batch",),
        function="_recv_fd_batch",
    ),
    Mutation(
        "the daemon's group may write the socket directory",
        "wcached/daemon/socket_dir.py",
        "    if mode & (stat.S_IWGRP | stat.S_IWOTH):",
        "    if mode & stat.S_IWOTH:",
        ("tests/daemon/test_service.py::test_socket_dir_others_could_write_is_refused",),
        function="problem",
    ),
    Mutation(
        "a socket directory the daemon's user cannot write is accepted",
        "wcached/daemon/socket_dir.py",
        "    if st.st_uid != uid:",
        "    if st.st_uid not in (uid, 0):",
        (
            "tests/daemon/test_service.py::test_a_socket_dir_the_daemons_user_cannot_write_gets_a_fix_that_works",
        ),
        function="problem",
    ),
    Mutation(
        "models of two parallel layouts share one loader worker",
        "wcached/loaders/vllm/__init__.py",
        '        return ("vllm", self.tensor_parallel_size, self.pipeline_parallel_size, self.rendezvous)',
        "        return ()",
        ("tests/integrations/test_vllm.py::test_models_of_two_parallel_sizes_fill_in_one_instance",),
        function="VllmModel.worker_group",
    ),
    Mutation(
        "verify with nothing compared says ok",
        "wcached/cli/verify.py",
        '        state = "DIFFERS" if rep.problems else "ok" if compared else "NOT VERIFIED"',
        '        state = "DIFFERS" if rep.problems else "ok"',
        ("tests/cli/test_verify.py::test_nothing_compared_is_not_verified",),
        more=(("        unverified += not rep.problems and not compared", "        unverified += 0"),),
        function="run",
    ),
    Mutation(
        "a checkpoint file the daemon's user cannot open passes the check",
        "wcached/loaders/checkpoint.py",
        "                fd = os.open(f, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)",
        "                continue",
        (
            "tests/loaders/test_checkpoint.py::test_an_unopenable_shard_is_named",
            "tests/cli/test_cli.py::test_an_unreadable_shard_in_a_readable_directory_is_78_in_the_words_check_config_uses",
        ),
        function="Checkpoint.check_readable",
    ),
    Mutation(
        "the out-of-memory killer's victim is a dead worker",
        "wcached/daemon/filler.py",
        '            return OutOfMemory(f"loader worker was killed by the kernel',
        '            return WorkerDied(f"loader worker was killed by the kernel',
        (
            "tests/daemon/test_service.py::"
            "test_a_worker_the_oom_killer_took_is_out_of_memory_another_signal_a_dead_worker",
        ),
        function="_worker_death",
    ),
    Mutation(
        "the isolated resolver makes NVML not ready permanent",
        "wcached/device.py",
        "        raise (DeviceNotReady if r.returncode == DeviceNotReady.exit_status else DeviceError)"
        "(message)",
        "        raise DeviceError(message)",
        ("tests/test_device.py::test_the_isolated_resolver_keeps_not_ready_apart_from_absent",),
        function="_resolve_gpu_isolated",
    ),
    Mutation(
        "a loader environment that cannot be told now is a change",
        "wcached/daemon/provenance.py",
        "        raise EnvironmentAway(str(e)) from None",
        "        raise NotRestorable(str(e)) from None",
        ("tests/daemon/test_holdings.py::test_a_loader_environment_that_cannot_be_told_now_is_away",),
        function="loader_environment",
    ),
    Mutation(
        "the GPU digest ignores where a word is",
        "wcached/tensor_digest.py",
        "        sums[0] += _mix(words + _mix(index ^ _signed(_SEED1))).sum()",
        "        sums[0] += _mix(words).sum()",
        ("tests/test_tensor_digest.py::test_device_digest_is_the_documented_formula",),
        function="device_digest",
    ),
    Mutation(
        "the daemon's own user is not allowed",
        "wcached/daemon/peers.py",
        "        if peer.uid in (0, self.own_uid) or peer.uid in self.uids:",
        "        if peer.uid in (0,) or peer.uid in self.uids:",
        ("tests/daemon/test_own_user.py::test_the_daemons_own_user_attaches_and_administers",),
        function="AccessPolicy.allows",
    ),
    Mutation(
        "any allowed user may administer",
        "wcached/daemon/peers.py",
        "        return peer.uid in (0, self.own_uid)",
        "        return peer.uid in (0, self.own_uid) or peer.uid in self.uids",
        ("tests/daemon/test_own_user.py::test_an_allowed_user_attaches_but_may_not_administer",),
        function="AccessPolicy.may_administer",
    ),
    Mutation(
        "the daemon's own uid taken as root",
        "wcached/daemon/peers.py",
        "        return cls(os.getuid(), frozenset(uids), frozenset(gids))",
        "        return cls(0, frozenset(uids), frozenset(gids))",
        ("tests/daemon/test_own_user.py::test_the_daemons_own_user_attaches_and_administers",),
        function="AccessPolicy.from_names",
    ),
    Mutation(
        "a client does not trust a daemon of its own user",
        "wcached/client/connection.py",
        "    uids = {0, os.geteuid()}",
        "    uids = {0}",
        ("tests/daemon/test_own_user.py::test_the_daemons_own_user_attaches_and_administers",),
        function="trusted_daemon_uids",
    ),
    Mutation(
        "a client trusts any daemon user",
        "wcached/client/connection.py",
        "    if uid not in trusted_daemon_uids(users):",
        "    if uid not in trusted_daemon_uids(users) and uid == -1:",
        (
            "tests/daemon/test_own_user.py::test_a_client_trusts_a_daemon_of_its_own_user_and_root_only_when_told",
        ),
        function="check_daemon_peer",
    ),
)
