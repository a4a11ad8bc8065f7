// Package wire translates between the LLM APIs Sluice speaks: OpenAI's
// Chat Completions (the form every job carries through the mesh), OpenAI's
// Responses API and Anthropic's Messages API. It does no I/O beyond
// writing stream events to the writer it is given.
//
// At the front door a Responses request becomes a chat body
// (Request.ChatBody) and its chat answer a Response object (FromChat) or
// the typed Responses events (Events); a Messages request becomes a chat
// body (MessagesToChat) and its answer a message (ChatToMessage) or
// Anthropic's events (MessageEvents). At the provider, an Anthropic
// provider gets the chat body as a Messages request (ChatToAnthropic) and
// answers as chat (AnthropicToChat); a provider serving the Responses API
// natively gets it as a Responses request (ChatToResponses) and answers
// as chat (ResponseToChat, NativeStream; AnthropicChunks for a streamed
// Messages answer). So every service between handles every job alike.
// ChatUsage is the one type OpenAI's usage object is read and written with.
package wire
