"""proton-c through python-qpid-proton's cffi module, checked at import.

`cproton_ffi` is internal to python-qpid-proton (tested with python-qpid-proton >=0.40,<0.41): every
name the engine calls is checked here once, so a proton release that renames or drops one fails at
start-up with the names, not later with an AttributeError on a hot path.
"""

from __future__ import annotations

try:
    from cproton_ffi import ffi, lib
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError(
        "the AMQP engine needs python-qpid-proton 0.40 (its cffi module cproton_ffi is missing): "
        "pip install 'python-qpid-proton>=0.40,<0.41'"
    ) from e

NEEDED = """
pn_collector pn_collector_peek pn_collector_pop pn_collector_release pn_collector_more
pn_connection pn_connection_collect pn_connection_open pn_connection_close pn_connection_release
pn_connection_state pn_connection_condition pn_connection_remote_condition pn_connection_set_container
pn_connection_set_hostname pn_connection_set_user pn_connection_set_password pn_connection_remote_container
pn_connection_remote_hostname pn_connection_properties pn_connection_remote_properties
pn_connection_offered_capabilities pn_connection_remote_offered_capabilities pn_connection_transport
pn_transport pn_transport_set_server pn_transport_bind pn_transport_unbind pn_transport_push
pn_transport_pending pn_transport_peek pn_transport_pop pn_transport_capacity pn_transport_close_tail
pn_transport_close_head pn_transport_tick pn_transport_set_idle_timeout pn_transport_get_remote_idle_timeout
pn_transport_condition pn_transport_set_max_frame pn_transport_closed
pn_sasl pn_sasl_allowed_mechs pn_sasl_set_allow_insecure_mechs pn_sasl_outcome
pn_session pn_session_open pn_session_close pn_session_free pn_session_state pn_session_connection
pn_session_condition pn_session_remote_condition pn_session_set_incoming_capacity
pn_link_session pn_link_state pn_link_open pn_link_close pn_link_detach pn_link_free pn_link_name
pn_link_is_sender pn_link_credit pn_link_flow pn_link_drain pn_link_drained pn_link_get_drain
pn_link_queued pn_link_recv pn_link_send pn_link_advance pn_link_current pn_link_source pn_link_target
pn_link_remote_source pn_link_remote_target pn_link_condition pn_link_remote_condition
pn_link_set_snd_settle_mode pn_link_set_rcv_settle_mode pn_link_remote_snd_settle_mode
pn_link_properties pn_link_remote_properties pn_link_unsettled pn_link_available pn_link_offered
pn_session pn_sender pn_receiver
pn_delivery pn_delivery_tag pn_delivery_link pn_delivery_readable pn_delivery_partial pn_delivery_pending
pn_delivery_aborted pn_delivery_settle pn_delivery_settled pn_delivery_update pn_delivery_remote_state
pn_delivery_local pn_delivery_remote pn_delivery_updated
pn_disposition_condition pn_disposition_set_failed pn_disposition_set_undeliverable
pn_disposition_is_failed pn_disposition_is_undeliverable pn_disposition_annotations
pn_terminus_get_address pn_terminus_set_address pn_terminus_filter pn_terminus_capabilities
pn_terminus_get_distribution_mode pn_terminus_set_distribution_mode pn_terminus_get_durability
pn_terminus_set_durability pn_terminus_get_expiry_policy pn_terminus_set_expiry_policy
pn_terminus_get_timeout pn_terminus_set_timeout pn_terminus_is_dynamic pn_terminus_set_dynamic
pn_terminus_get_type pn_terminus_set_type pn_terminus_properties
pn_condition_is_set pn_condition_get_name pn_condition_get_description pn_condition_set_name
pn_condition_set_description
pn_data_encoded_size pn_data_encode pn_data_decode pn_data_clear pn_data_rewind pn_data_error pn_error_code
pn_event_type pn_event_type_name pn_event_connection pn_event_session pn_event_link pn_event_delivery pn_event_transport
pn_incref pn_decref
pn_terminus_copy pn_link_set_drain pn_link_remote_rcv_settle_mode pn_link_remote_max_message_size
pn_transport_trace pn_transport_set_tracer pn_transport_attachments pn_pytracer
pn_condition_info pn_link_set_max_message_size pn_link_head pn_link_next pn_session_head pn_session_next
""".split()

_missing = sorted({name for name in NEEDED if not hasattr(lib, name)})
if _missing:  # pragma: no cover - depends on the installation
    raise ImportError(
        "python-qpid-proton's cffi module lacks " + ", ".join(_missing)
        + ": the AMQP engine is tested with python-qpid-proton >=0.40,<0.41"
    )

__all__ = ["ffi", "lib"]
