// Package wire translates between the LLM APIs Sluice speaks: OpenAI's
// Chat Completions (the form every job carries through the mesh), OpenAI's
// Responses API and, in time, Anthropic's Messages API. It does no I/O.
//
// A Responses request becomes a chat-completions body at the front door
// (Request.ChatBody); the chat answer becomes a Response object
// (FromChat) or a stream of typed Responses events (Events). A provider
// that serves the Responses API natively gets the chat body translated
// back (ChatToResponses) and its answer translated to chat
// (ResponseToChat, NativeStream), so the executor handles every job
// alike.
package wire
