"""JetStreamConsumeOperator: process messages in a Python function, as the Kafka provider's ConsumeFromTopicOperator."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from airflow_jetstream.client.errors import InvalidFunctionError
from airflow_jetstream.client.reading.apply_function import bind_function, load_function
from airflow_jetstream.client.reading.consume_options import (
    DEFAULT_ACK_WAIT,
    DEFAULT_NAK_DELAY,
    ConsumeOptions,
    Duration,
)
from airflow_jetstream.operators.base import JetStreamBaseOperator, subject_list, templated_int
from airflow_jetstream.ui.links import JetStreamViewLink


class JetStreamConsumeOperator(JetStreamBaseOperator):
    """Read messages from a stream and call ``apply_function`` on each one (or on each batch).

    **Durable** (``consumer`` given): reads a durable pull consumer, created when missing (explicit
    acks, filtered to ``filter_subjects``, from ``start_seq``/``start_time`` or the stream's start) or bound as
    it is. A message is acknowledged only after ``apply_function`` returned for it (its batch with
    ``apply_function_batch``). When the function raises an exception listed in ``term_on`` the message
    is terminated (never redelivered, a ``msg_terminated`` advisory is published) and consuming goes
    on; any other exception naks it with a back-off delay (``nak_delay``, by delivery count), naks what
    else was delivered, and fails the task. A task retry reads the consumer again: nothing
    unacknowledged is lost or skipped, nothing acknowledged is processed twice.

    **Ordered read** (no ``consumer``): the messages from ``start_seq`` (or ``start_time``, or the first)
    to ``end_seq`` (default: the last one stored when the task starts), in order, nothing acknowledged;
    a retry reads the same range again from its start. Chain runs with the summary's ``next_seq``.

    Reads until ``max_messages`` were processed or no message arrives within ``fetch_timeout``. Returns
    a JSON summary: ``processed``, ``acked``, ``terminated``, ``batches``, ``first_seq``, ``last_seq``,
    ``stopped`` (and ``num_pending`` for a consumer, ``next_seq`` for an ordered read)::

        JetStreamConsumeOperator(
            task_id="bill_orders",
            stream="ORDERS",
            consumer="billing",
            filter_subjects=["orders.created"],
            apply_function="my_pkg.billing.bill_order",   # bill_order(message, *args, **kwargs)
            max_messages=500,
        )

    :param stream: the stream (templated).
    :param apply_function: called as ``f(message, *apply_function_args, **apply_function_kwargs)`` with a
        :class:`~airflow_jetstream.client.reading.messages.Message` (``subject``, ``seq``, ``data``,
        ``headers``, ``time``, ``delivered``, ``text``, ``json()``); a callable or a dotted path.
    :param apply_function_batch: instead, called with the list of messages of each batch.
    :param apply_function_args, apply_function_kwargs: extra arguments (templated).
    :param consumer: durable pull consumer name (templated); None for an ordered read.
    :param filter_subjects: the subjects to read (wildcards allowed; templated).
    :param start_seq, start_time: where a new consumer or an ordered read starts (templated).
    :param end_seq: last sequence of an ordered read (templated).
    :param max_messages: stop after this many messages (None: until nothing arrives within ``fetch_timeout``).
    :param batch_size: messages per pull request (and per ``apply_function_batch`` call).
    :param fetch_timeout: how long one pull request waits on the server (seconds, "30s" or timedelta); a pull
        that gets nothing ends the task.
    :param nak_delay: seconds before a failed message is redelivered; a list is indexed by delivery count.
    :param term_on: exception classes (or dotted paths) that terminate the message instead.
    :param create_consumer: create the consumer when missing (default) or fail.
    :param ack_wait: a created consumer's ack wait (longer than the function takes per batch).
    :param max_deliver: a created consumer's maximum deliveries per message (default unlimited).
    :param nats_conn_id: the ``nats`` connection to use (templated).
    """

    template_fields: Sequence[str] = ("stream", "consumer", "filter_subjects", "start_seq", "start_time", "end_seq",
                                      "apply_function_args", "apply_function_kwargs", "nats_conn_id")
    operator_extra_links = (JetStreamViewLink(),)

    def __init__(
        self,
        *,
        stream: str,
        apply_function: Callable[..., Any] | str | None = None,
        apply_function_batch: Callable[..., Any] | str | None = None,
        apply_function_args: Sequence[Any] | None = None,
        apply_function_kwargs: dict[str, Any] | None = None,
        consumer: str | None = None,
        filter_subjects: Sequence[str] | str | None = None,
        start_seq: int | str | None = None,
        start_time: datetime | str | None = None,
        end_seq: int | str | None = None,
        max_messages: int | None = None,
        batch_size: int = 100,
        fetch_timeout: Duration = 5.0,
        nak_delay: Duration | Sequence[Duration] = DEFAULT_NAK_DELAY,
        term_on: Sequence[type[BaseException] | str] = (),
        create_consumer: bool = True,
        ack_wait: Duration = DEFAULT_ACK_WAIT,
        max_deliver: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if (apply_function is None) == (apply_function_batch is None):
            raise InvalidFunctionError("give exactly one of apply_function (per message) or apply_function_batch "
                                       "(per batch)")
        self.stream = stream
        self.apply_function = apply_function
        self.apply_function_batch = apply_function_batch
        self.apply_function_args = apply_function_args
        self.apply_function_kwargs = apply_function_kwargs
        self.consumer = consumer
        self.filter_subjects = filter_subjects
        self.start_seq = start_seq
        self.start_time = start_time
        self.end_seq = end_seq
        self.term_on = tuple(term_on)
        self.create_consumer = create_consumer
        self.ack_wait = ack_wait
        self.max_deliver = max_deliver
        self.options = ConsumeOptions(per_batch=apply_function_batch is not None, max_messages=max_messages,
                                      batch_size=batch_size, fetch_timeout=fetch_timeout, nak_delay=nak_delay)
        self._term_classes()  # bad classes or paths fail when the DAG is parsed

    def _term_classes(self) -> tuple[type[BaseException], ...]:
        classes: list[type[BaseException]] = []
        for term in self.term_on:
            found = load_function(term, what="term_on") if isinstance(term, str) else term
            if not (isinstance(found, type) and issubclass(found, BaseException)):
                raise InvalidFunctionError(
                    f"term_on must list exception classes or their dotted paths, got {self.term_on!r}")
            classes.append(found)
        return tuple(classes)

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow_jetstream.client.reading.consume import consume

        per_message = self.apply_function is not None
        function = self.apply_function if per_message else self.apply_function_batch
        assert function is not None  # __init__ requires exactly one of them
        func = bind_function(function, self.apply_function_args, self.apply_function_kwargs,
                             what="apply_function" if per_message else "apply_function_batch")
        options = replace(self.options, term_on=self._term_classes())
        consumer = self.consumer or None
        source = f"consumer {consumer}" if consumer else "an ordered read"
        self.log.info("Consuming stream %s via %s: up to %s message(s), batches of %d, waiting %.1f s for more",
                      self.stream, source, options.max_messages or "all", options.batch_size,
                      options.fetch_timeout_seconds)
        summary = self.hook.run(
            consume, self.stream, func, consumer=consumer, subjects=subject_list(self.filter_subjects),
            start_seq=templated_int(self.start_seq, "start_seq"), start_time=self.start_time or None,
            end_seq=templated_int(self.end_seq, "end_seq"), create=self.create_consumer,
            ack_wait=self.ack_wait, max_deliver=self.max_deliver, options=options,
        )
        self.log.info("Consumed %d message(s) of stream %s (seq %s..%s), %d acked, %d terminated, stopped: %s",
                      summary["processed"], self.stream, summary["first_seq"], summary["last_seq"], summary["acked"],
                      summary["terminated"], summary["stopped"])
        return summary


__all__ = ["JetStreamConsumeOperator"]
