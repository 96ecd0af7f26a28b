package dev.memcolo.sdk;

/**
 * A memory-pressure notification (docs/protocol.md §6 {@code notify}).
 *
 * @param seq the agent's sequence number, echoed in the answer
 * @param level "low", "high" or "top" (M3 §3, §5)
 * @param targetBytes about how much to give back, in bytes (unsigned: use
 *     {@link Long#toUnsignedString(long)} for values over 2^63)
 */
public record Notification(long seq, String level, long targetBytes) {}
